"""The seed's end-to-end research contract, across real processes.

Supervisor, two worker processes and the scratchpad run as `quarry serve`
processes; the model is the scripted OpenAI-compatible server and the web is
the local fixture site. The supervisor seeds the scratchpad; worker A reads the
seed, researches, promotes a verified finding and a unique marker; the
supervisor re-reads and sees the marker; a distinct worker B reads the seed and
A's marker, researches independently, promotes a second finding and an
acknowledgement; a third delegation fails at the provider and comes back as an
honest error; the supervisor reads the whole state and the run completes.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quarry.client import QuarryClient, ScratchpadClient, open_channel
from quarry.v1 import common_pb2, scratchpad_pb2, supervisor_pb2, worker_pb2
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography, append_finding
from tests.fakes.openai_server import Call, DropAfter, Reply, ScriptedModel, Stall
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.conftest import HISTORY, delegation_on, processes

pytestmark = pytest.mark.slow

MARKER = "MARKER-A-5f1c"
LEDGER_KINDS = {scratchpad_pb2.ENTRY_KIND_ASSIGNMENT, scratchpad_pb2.ENTRY_KIND_ROUTE, scratchpad_pb2.ENTRY_KIND_USAGE}
PUBLIC_PAYLOADS = {"status", "scratchpad", "reasoning", "content", "completed", "failed", "cancelled"}
INTERNAL_TOOLS = ("delegate_research", "read_scratchpad", "append_scratchpad", "perform_web_search", "read_web_page")


@pytest.fixture
async def script(model: ScriptedModel, site: FixtureWeb) -> AsyncIterator[Choreography]:
    choreography = Choreography()
    model.default = choreography
    site.add("/history.html", HISTORY)
    yield choreography


def verdict(name: str, checks: list[tuple[str, bool]]) -> bool:
    failed = [label for label, held in checks if not held]
    print(f"{name}={'PASS' if not failed else 'FAIL'}" + (f"  ({'; '.join(failed)})" if failed else ""))
    return not failed


async def test_the_seed_research_contract_across_processes(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, script: Choreography
) -> None:
    article, history = f"{site.base_url}/article.html", f"{site.base_url}/history.html"
    task_a = "Find the height of the Eiffel Tower. Add the marker " + MARKER + " when done."
    task_b = "Find when the Eiffel Tower was built. Acknowledge the marker of the previous worker."
    task_c = "Find the tower's colour."
    script.add(
        task_a,
        Reply(calls=(Call("read_scratchpad", {}, "a-read"),)),
        Reply(calls=(Call("perform_web_search", {"query": "Eiffel Tower"}, "a-search"),)),
        Reply(calls=(Call("read_web_page", {"url": article}, "a-page"),)),
        Reply(
            calls=(
                append_finding(
                    "a-finding",
                    "The Eiffel Tower is 330 metres tall.",
                    article,
                    "The tower is 330 metres tall",
                    title="The Eiffel Tower",
                ),
                Call("append_scratchpad", {"kind": "marker", "content": MARKER}, "a-marker"),
            )
        ),
        Reply(content="Promoted the height and the marker."),
    )
    script.add(
        task_b,
        Reply(calls=(Call("read_scratchpad", {}, "b-read"),)),
        Reply(calls=(Call("read_web_page", {"url": history}, "b-page"),)),
        Reply(
            calls=(
                append_finding(
                    "b-finding",
                    "The tower was built between January 1887 and May 1889.",
                    history,
                    "Construction of the Eiffel Tower began in January 1887",
                    title="Building the tower",
                ),
                Call("append_scratchpad", {"kind": "acknowledgement", "content": f"ACK {MARKER}"}, "b-ack"),
            )
        ),
        Reply(content="Promoted the dates and acknowledged the marker."),
    )
    script.add(task_c, DropAfter("The tower is painted in a colour that"))
    script.add(
        SUPERVISOR,
        Reply(content="First the height.", calls=(Call("delegate_research", {"objective": task_a}, "s-a"),)),
        Reply(calls=(Call("read_scratchpad", {}, "s-read-1"),)),
        Reply(content="Marker seen; now the dates.", calls=(Call("delegate_research", {"objective": task_b}, "s-b"),)),
        Reply(calls=(Call("delegate_research", {"objective": task_c}, "s-c"),)),
        Reply(calls=(Call("read_scratchpad", {}, "s-read-2"),)),
        Reply(content="Height and dates are verified; the colour is unknown."),
    )
    report_text = (
        "## The Eiffel Tower\n\nThe tower is 330 metres tall [1]. It was built from 1887 to 1889 [2], "
        "and its colour is not established [9]. Both figures come from pages the workers read and quoted; "
        "the colour question remains open because that delegation failed at the provider."
    )
    script.add(REPORT, Reply(content=report_text, chunks=12))

    with processes(tmp_path, model, site) as mesh:
        async with QuarryClient.connect(mesh.supervisor.address) as client:
            run = await client.start_run("How tall is the Eiffel Tower, and when was it built?")
            events = [event async for event in client.stream_run(run.run_id)]
            stored = await client.get_run(run.run_id)
        async with open_channel(mesh.scratchpad.address, token=mesh.supervisor_token) as channel:
            entries = await ScratchpadClient(channel).read_all(run.scratchpad_thread_id)
        statuses = [e.status for e in events if e.HasField("status")]
        delegations = [s.delegation_id for s in statuses if s.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_DELEGATED]
        assert len(delegations) == 3, statuses
        placed = [
            [await delegation_on(worker.address, delegation_id, mesh.supervisor_token) for worker in mesh.workers]
            for delegation_id in delegations
        ]

    payloads = [event.WhichOneof("payload") for event in events]
    completed = events[-1].completed
    content = "".join(e.content.delta for e in events if e.HasField("content"))
    reasoning = "".join(e.reasoning.delta for e in events if e.HasField("reasoning"))
    serialized = b"".join(event.SerializeToString() for event in events)

    inference_stream = verdict(
        "INFERENCE_STREAM",
        [
            ("events numbered 1..n", [e.sequence_no for e in events] == list(range(1, len(events) + 1))),
            ("report streamed in several content events", payloads.count("content") >= 2),
            ("streamed text is the report", content == completed.report.markdown),
            ("supervisor reasoning streamed", "Marker seen; now the dates." in reasoning),
            ("one terminal event, last", payloads[-1] == "completed" and payloads.count("completed") == 1),
        ],
    )
    core_tool_boundary = verdict(
        "CORE_TOOL_BOUNDARY",
        [
            ("only public event kinds", set(payloads) <= PUBLIC_PAYLOADS),
            ("no tool name reaches the client", not any(name.encode() in serialized for name in INTERNAL_TOOLS)),
            (
                "every supervisor tool call answered once",
                all(
                    sorted(
                        c["id"] for m in body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []
                    )
                    == sorted(m["tool_call_id"] for m in body["messages"] if m["role"] == "tool")
                    for body in script.requests[SUPERVISOR]
                ),
            ),
            (
                "no worker transcript in the supervisor's context",
                all("330 metres tall, about the same height" not in str(b) for b in script.requests[SUPERVISOR]),
            ),
        ],
    )
    # The research entries; the supervisor's ledger (assignment, route, usage of each delegation) lies between them.
    research = [entry for entry in entries if entry.kind not in LEDGER_KINDS]
    ledger = [entry.kind for entry in entries if entry.kind in LEDGER_KINDS]
    kinds = [(entry.kind, entry.author.role) for entry in research]
    supervisor_reads = [str(body["messages"]) for body in script.requests[SUPERVISOR]]
    worker_b_reads = str(script.requests[task_b][1]["messages"])
    shared_scratchpad = verdict(
        "SHARED_SCRATCHPAD",
        [
            ("seed first, by the supervisor", kinds[0] == (scratchpad_pb2.ENTRY_KIND_SEED, common_pb2.ROLE_SUPERVISOR)),
            ("worker A read the seed", "Research question" in str(script.requests[task_a][1]["messages"])),
            (
                "A's finding and marker, then B's finding and acknowledgement",
                kinds[1:]
                == [
                    (scratchpad_pb2.ENTRY_KIND_FINDING, common_pb2.ROLE_RESEARCHER),
                    (scratchpad_pb2.ENTRY_KIND_MARKER, common_pb2.ROLE_RESEARCHER),
                    (scratchpad_pb2.ENTRY_KIND_FINDING, common_pb2.ROLE_RESEARCHER),
                    (scratchpad_pb2.ENTRY_KIND_ACKNOWLEDGEMENT, common_pb2.ROLE_RESEARCHER),
                ],
            ),
            ("the supervisor saw the marker before delegating B", MARKER in supervisor_reads[2]),
            (
                "worker B read the seed and A's marker",
                "Research question" in worker_b_reads and MARKER in worker_b_reads,
            ),
            ("B acknowledged the marker", research[4].content == f"ACK {MARKER}"),
            ("A and B are different principals", research[1].author.principal_id != research[3].author.principal_id),
            (
                "each delegation assigned and its usage observed",
                ledger.count(scratchpad_pb2.ENTRY_KIND_ASSIGNMENT)
                == 3
                == ledger.count(scratchpad_pb2.ENTRY_KIND_USAGE),
            ),
            (
                "every entry reached the client once, in order",
                [e.scratchpad.scratchpad_sequence_no for e in events if e.HasField("scratchpad")]
                == list(range(1, len(entries) + 1)),
            ),
            ("the supervisor read the whole state", f"ACK {MARKER}" in supervisor_reads[5]),
        ],
    )
    citations = list(completed.report.citations)
    deep_research = verdict(
        "DEEP_RESEARCH_INTEGRATION",
        [
            ("run succeeded", stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED),
            ("A and B ran on distinct worker processes", placed[0][0] is not None and placed[1][1] is not None),
            ("not on the other", placed[0][1] is None and placed[1][0] is None),
            (
                "citations resolve to verified entries",
                [(c.number, c.scratchpad_sequence_no) for c in citations]
                == [(1, research[1].sequence_no), (2, research[3].sequence_no)],
            ),
            ("quotes are the workers' verified excerpts", citations[0].excerpt == "The tower is 330 metres tall"),
            (
                "the unresolvable [9] was removed and counted",
                "[9]" not in completed.report.markdown and completed.removed_citations == 1,
            ),
            (
                "usage per tier",
                completed.usage.workers.model_calls >= 8 and completed.usage.supervisor.model_calls == 7,
            ),
            ("stored run carries the report", stored.report == completed.report),
        ],
    )
    failed_delegation = placed[2][0] or placed[2][1]
    failure_status = [s for s in statuses if s.delegation_id == delegations[2]][-1]
    supervisor_saw = script.requests[SUPERVISOR][4]["messages"][-1]["content"]
    worker_failure = verdict(
        "WORKER_FAILURE_LIFECYCLE",
        [
            ("worker failed status", failure_status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_FAILED),
            (
                "provider error code",
                failure_status.delegation_error.code == common_pb2.DELEGATION_ERROR_CODE_PROVIDER_ERROR,
            ),
            ("the supervisor got an error result", supervisor_saw.startswith("error: delegation")),
            ("partial prose discarded", "painted in a colour" not in supervisor_saw),
            (
                "the worker recorded the failure",
                failed_delegation is not None
                and failed_delegation.state == worker_pb2.DELEGATION_STATE_FAILED
                and "provider_error" in failed_delegation.last_error
                and not failed_delegation.result.summary,
            ),
        ],
    )
    assert inference_stream and core_tool_boundary and shared_scratchpad and deep_research and worker_failure


async def test_a_worker_killed_mid_delegation_is_one_correlated_error_and_the_run_ends_honestly(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, script: Choreography
) -> None:
    script.add("Research slowly", Stall(60))
    script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Research slowly"}, "s-slow"),)),
        Reply(content="The worker was lost; report what exists."),
    )
    script.add(REPORT, Reply(content="Nothing could be verified."))
    with processes(tmp_path, model, site) as mesh:
        async with QuarryClient.connect(mesh.supervisor.address) as client:
            run = await client.start_run("Will the worker survive?")
            for _ in range(400):
                if "Research slowly" in script.requests:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("no worker asked the model")
            events = []
            async for event in client.stream_run(run.run_id):
                events.append(event)
                if event.status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING:
                    delegation_id = event.status.delegation_id
                    token = mesh.supervisor_token
                    [victim] = [w for w in mesh.workers if await delegation_on(w.address, delegation_id, token)]
                    os.kill(victim.process.pid, signal.SIGKILL)
            stored = await client.get_run(run.run_id)
    assert victim.process.wait(10) == -signal.SIGKILL
    ends = [
        e.status
        for e in events
        if e.status.phase
        in (supervisor_pb2.RESEARCH_PHASE_WORKER_COMPLETED, supervisor_pb2.RESEARCH_PHASE_WORKER_FAILED)
    ]
    assert len(ends) == 1 and ends[0].phase == supervisor_pb2.RESEARCH_PHASE_WORKER_FAILED
    assert ends[0].delegation_id == delegation_id
    assert ends[0].delegation_error.code == common_pb2.DELEGATION_ERROR_CODE_WORKER_UNAVAILABLE
    [result] = script.tool_results(SUPERVISOR)
    assert result.startswith(f"error: delegation {delegation_id} failed (WORKER_UNAVAILABLE)")
    assert events[-1].WhichOneof("payload") == "completed"
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED and stored.report.markdown == "Nothing could be verified."
