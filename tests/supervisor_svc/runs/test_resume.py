"""A supervisor killed mid-run: another supervisor process takes the run up and finishes it, asking the model
again for nothing it had answered (real processes, SIGKILL).

The tests that kill only the supervisor share one mesh (each kill leaves the next test a new supervisor);
a worker killed, and a database cut off, get meshes of their own."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from quarry.cli.ask import EXIT_SUPERVISOR_LOST
from quarry.clients.runs import RunsClient
from quarry.v1 import common_pb2, supervisor_pb2
from tests.conftest import postgres_schema, stop_service
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography, append_finding
from tests.fakes.evidence import OPENED, OPENING, S_OPENED, EvidenceScript, add_pages, marked, research, verdict
from tests.fakes.loopback import served_in_thread
from tests.fakes.openai_server import Await, Call, Reply, ScriptedModel, StallAfter, Step
from tests.fakes.tcp_proxy import TcpProxy
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.conftest import ProcessMesh, delegation_on, processes

pytestmark = pytest.mark.slow

# Taken up within a few seconds of the kill, not the default 30.
_LEASE = {"QUARRY_SUPERVISOR_RUN_LEASE_SECONDS": "2"}


@pytest.fixture
def script(model: ScriptedModel) -> Choreography:
    """The script of a test that starts a mesh of its own."""
    choreography = Choreography()
    model.default = choreography
    return choreography


@pytest.fixture(scope="module")
def mesh(
    tmp_path_factory: pytest.TempPathFactory, shared_model: ScriptedModel, shared_site: FixtureWeb
) -> Iterator[ProcessMesh]:
    """One mesh for the tests that kill its supervisor: each kill leaves a new supervisor for the next test."""
    env = {**_LEASE, "QUARRY_SUPERVISOR_ALLOW_SELF_APPROVAL": "true"}
    with processes(tmp_path_factory.mktemp("mesh"), shared_model, shared_site, env) as shared:
        yield shared


@pytest.fixture
def site(shared_site: FixtureWeb) -> FixtureWeb:
    return shared_site


@pytest.fixture
def shared_script(shared_model: ScriptedModel, shared_site: FixtureWeb) -> EvidenceScript:
    """The script of a test on the shared mesh (an EvidenceScript answers the verification roles too)."""
    shared_model.forget()
    choreography = EvidenceScript(site_url=shared_site.base_url)
    shared_model.default = choreography
    add_pages(shared_site)
    return choreography


async def _wait_for(condition: object, what: str, seconds: float = 20.0) -> None:
    assert callable(condition)
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_supervisor_killed_during_a_delegation_is_taken_up_and_the_run_succeeds(
    mesh: ProcessMesh, site: FixtureWeb, shared_script: EvidenceScript
) -> None:
    script = shared_script
    page = _script_an_interrupted_measurement(script, site)
    async with RunsClient.connect(mesh.supervisor.address) as client:
        run = await client.start_run("How tall is the tower?")
        await _wait_for(lambda: len(script.requests.get("Measure the tower", ())) == 2, "the worker's second call")
        seen = [event async for event in _until_researching(client, run.run_id)]
    delegation_id = seen[-1].status.delegation_id
    _crash_and_restart_the_supervisor(mesh)
    async with RunsClient.connect(mesh.supervisor.address) as client:
        # The stream goes on from the last event this client saw, through the takeover.
        rest = [event async for event in client.stream_run(run.run_id, after_sequence_no=seen[-1].sequence_no)]
        stored = await client.get_run(run.run_id)
    records = [await delegation_on(w.address, delegation_id, mesh.supervisor_token) for w in mesh.workers]
    [delegation] = [record for record in records if record is not None]
    events = seen + rest
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1)), "one gap-free sequence"
    assert events[-1].WhichOneof("payload") == "completed", events[-1].failed.error.message
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED
    assert stored.report.markdown.startswith("The tower is 330 m tall [1].")
    assert [c.url for c in stored.report.citations] == [page]
    # The supervisor's recorded turn was not asked again; the worker repeated only the call in flight.
    assert len(script.requests[SUPERVISOR]) == 2
    assert len(script.requests["Measure the tower"]) == 4
    assert delegation.result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED
    taken_up = [e for e in rest if e.status.phase == supervisor_pb2.RESEARCH_PHASE_STARTED]
    assert len(taken_up) == 1 and "taken up again" in taken_up[0].status.message
    # The delegation continued under its id: it ran once, on one conversation.
    delegated = [e for e in events if e.status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_DELEGATED]
    assert {e.status.delegation_id for e in delegated} == {delegation_id}


async def _quarry(*args: str) -> asyncio.subprocess.Process:
    """`quarry ARGS` as a user runs it, its stderr with its stdout."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quarry",
        *args,
        env={**os.environ, "COLUMNS": "160"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


async def _line_with(process: asyncio.subprocess.Process, text: str, seconds: float = 30.0) -> tuple[str, float]:
    """The first line of the process's output holding `text`, and when it came (the loop's clock)."""
    assert process.stdout is not None
    async with asyncio.timeout(seconds):
        while line := (await process.stdout.readline()).decode():
            if text in line:
                return line, asyncio.get_running_loop().time()
    raise AssertionError(f"the output ended without {text!r}")


async def test_ask_says_at_once_that_the_supervisor_went_away_and_follows_the_run_again_when_it_is_back(
    mesh: ProcessMesh, site: FixtureWeb, shared_script: EvidenceScript
) -> None:
    script = shared_script
    _script_an_interrupted_measurement(script, site)
    address = mesh.supervisor.address
    ask = await _quarry("ask", "How tall is the tower?", "--address", address, "--verification", "off")
    await _wait_for(lambda: len(script.requests.get("Measure the tower", ())) == 2, "the worker's second call")
    os.kill(mesh.supervisor.process.pid, signal.SIGKILL)
    killed = asyncio.get_running_loop().time()
    line, said = await _line_with(ask, "went away")
    assert line.strip() == "quarry: the supervisor went away; waiting for it (Ctrl-C to stop)"
    assert said - killed < 2.0, "said within 2 seconds"
    assert mesh.supervisor.process.wait(10) == -signal.SIGKILL
    mesh.start_supervisor(port=int(address.rsplit(":", 1)[1]))  # where ask looks for it
    await _line_with(ask, "the supervisor is back; following the run again")
    output, _ = await asyncio.wait_for(ask.communicate(), 60)
    assert ask.returncode == 0, output.decode()
    assert "The tower is 330 m tall" in output.decode()


async def test_ask_gives_a_supervisor_that_stays_away_up_and_runs_watch_takes_the_run_up(
    mesh: ProcessMesh, site: FixtureWeb, shared_script: EvidenceScript
) -> None:
    script = shared_script
    _script_an_interrupted_measurement(script, site)
    address = mesh.supervisor.address
    ask = await _quarry(
        "ask", "How tall is the tower?", "--address", address, "--verification", "off", "--wait-for-supervisor", "2"
    )
    await _wait_for(lambda: len(script.requests.get("Measure the tower", ())) == 2, "the worker's second call")
    os.kill(mesh.supervisor.process.pid, signal.SIGKILL)
    assert mesh.supervisor.process.wait(10) == -signal.SIGKILL
    output, _ = await asyncio.wait_for(ask.communicate(), 30)
    text = output.decode()
    assert ask.returncode == EXIT_SUPERVISOR_LOST, text
    [run_id] = re.findall(r"quarry runs watch (run-\w+)", text)
    assert "the supervisor did not come back within 2 s" in text
    mesh.start_supervisor()
    watch = await _quarry("runs", "watch", run_id, "--address", mesh.supervisor.address, "--json")
    output, _ = await asyncio.wait_for(watch.communicate(), 60)
    assert watch.returncode == 0, output.decode()
    events = [json.loads(line) for line in output.decode().splitlines() if line.startswith("{")]
    assert [int(event["sequenceNo"]) for event in events] == list(range(1, len(events) + 1)), "every event, once"
    assert "completed" in events[-1] and events[-1]["completed"]["report"]["markdown"].startswith("The tower is")


async def _until_researching(client: RunsClient, run_id: str):  # type: ignore[no-untyped-def]
    async for event in client.stream_run(run_id):
        yield event
        if event.status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING:
            return


async def test_a_run_awaiting_approval_waits_again_after_a_restart_and_a_crash(
    mesh: ProcessMesh, shared_script: EvidenceScript
) -> None:
    script = shared_script
    script.add(SUPERVISOR, Reply(content="No research needed."))
    script.add(REPORT, Reply(content="Nothing needed researching."))
    options = supervisor_pb2.RunOptions(verification=supervisor_pb2.VERIFICATION_MODE_OFF, require_approval=True)
    async with RunsClient.connect(mesh.supervisor.address) as client:
        run = await client.start_run("Approve me later?", options=options)
        async for event in client.stream_run(run.run_id):
            if event.status.phase == supervisor_pb2.RESEARCH_PHASE_AWAITING_APPROVAL:
                break
    # A graceful restart, then a crash: neither cancels the run.
    assert stop_service(mesh.supervisor) == 0
    mesh.start_supervisor()
    _crash_and_restart_the_supervisor(mesh)
    async with RunsClient.connect(mesh.supervisor.address) as client:
        waiting = await client.get_run(run.run_id)
        approved = await client.approve_run(run.run_id, "Looks right.")
        events = [event async for event in client.stream_run(run.run_id)]
    assert waiting.state == supervisor_pb2.RUN_STATE_AWAITING_APPROVAL
    assert approved.state == supervisor_pb2.RUN_STATE_SUCCEEDED
    assert approved.report.markdown == "Nothing needed researching."
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1))
    assert events[-1].WhichOneof("payload") == "completed"
    assert len(script.requests[SUPERVISOR]) == 1 and len(script.requests[REPORT]) == 1, "nothing asked twice"


async def test_a_supervisor_killed_while_writing_the_report_is_taken_up_and_writes_it_again(
    mesh: ProcessMesh, shared_script: EvidenceScript
) -> None:
    script = shared_script
    begun = "The report begins " + "and goes on " * 20  # over 200 characters: streamed as an event at once
    script.add(SUPERVISOR, Reply(content="No research needed."))
    # The first report call streams its start, then nothing: the supervisor dies with it in flight.
    script.add(REPORT, StallAfter(begun, 120), Reply(content="The report, written again."))
    async with RunsClient.connect(mesh.supervisor.address) as client:
        run = await client.start_run("Write it twice?")
        async for event in client.stream_run(run.run_id):
            if event.WhichOneof("payload") == "content":
                break
    _crash_and_restart_the_supervisor(mesh)
    async with RunsClient.connect(mesh.supervisor.address) as client:
        events = [event async for event in client.stream_run(run.run_id)]
        stored = await client.get_run(run.run_id)
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED
    assert stored.report.markdown == "The report, written again."
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1))
    # The supervisor's answer was recorded: only the call in flight was asked again.
    assert len(script.requests[SUPERVISOR]) == 1 and len(script.requests[REPORT]) == 2
    # Clients that join the report's text are told to start over where it is written again.
    rewriting = [e.sequence_no for e in events if "replaces the text streamed before" in e.status.message]
    streamed = [e.sequence_no for e in events if e.WhichOneof("payload") == "content"]
    assert len(rewriting) == 1 and streamed[0] < rewriting[0] < streamed[-1]
    assert "".join(e.content.delta for e in events if e.sequence_no > rewriting[0]) == "The report, written again."


async def test_a_run_waits_out_a_postgresql_outage_longer_than_its_lease_and_succeeds(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, script: Choreography
) -> None:
    answered = asyncio.Event()
    script.add(
        SUPERVISOR,
        # The answer comes while the database is away: recording it fails, so it is asked again.
        Await(answered, Reply(content="Nothing to research.")),
        Reply(content="Nothing to research."),
    )
    script.add(REPORT, Reply(content="Nothing was researched."))
    # The proxy is served from a thread of its own: starting the processes blocks this loop.
    with (
        postgres_schema() as schema,
        served_in_thread(TcpProxy("127.0.0.1", make_url(schema.url).port or 5432)) as proxy,
    ):
        proxied = make_url(schema.url).set(host="127.0.0.1", port=proxy.port)
        env = {**_LEASE, "QUARRY_SUPERVISOR_DATABASE_URL": proxied.render_as_string(hide_password=False)}
        with processes(tmp_path, model, site, env) as mesh:
            async with RunsClient.connect(mesh.supervisor.address) as client:
                run = await client.start_run("Will the database come back?")
                await _wait_for(lambda: SUPERVISOR in script.requests, "the supervisor's first model call")
                events = []
                async with asyncio.TaskGroup() as group:
                    follow = group.create_task(_collect(client, run.run_id, events))
                    await _wait_for(lambda: events, "the stream's first event")
                    proxy.cut()
                    answered.set()
                    await asyncio.sleep(6)  # three times the lease
                    proxy.restore()
                    await asyncio.wait_for(follow, 60)
                stored = await client.get_run(run.run_id)
            log = mesh.supervisor.log()
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED, f"{stored.error}\n{log}"
    assert stored.report.markdown == "Nothing was researched."
    # The stream lived through the outage: one gap-free sequence, with the wait told.
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1))
    assert events[-1].WhichOneof("payload") == "completed"
    assert any("the database was unreachable" in e.status.message for e in events)
    assert len(script.requests[SUPERVISOR]) == 2, "only the answer lost with the database is asked again"
    assert log.count("Traceback") == 0, log


async def _collect(client: RunsClient, run_id: str, events: list[supervisor_pb2.RunEvent]) -> None:
    async for event in client.stream_run(run_id, max_reconnects=0):
        events.append(event)


async def test_a_worker_killed_mid_delegation_is_continued_on_another_worker_over_the_same_database(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, script: Choreography
) -> None:
    page = _script_an_interrupted_measurement(script, site)
    env = {"QUARRY_WORKER_LEASE_SECONDS": "2"}
    with processes(tmp_path, model, site, env, shared_worker_database=True) as mesh:
        async with RunsClient.connect(mesh.supervisor.address) as client:
            run = await client.start_run("How tall is the tower?")
            await _wait_for(lambda: len(script.requests.get("Measure the tower", ())) == 2, "the worker's second call")
            researching = [event async for event in _until_researching(client, run.run_id)][-1]
            running = await delegation_on(
                mesh.workers[0].address, researching.status.delegation_id, mesh.supervisor_token
            )
            assert running is not None and running.worker_id in ("worker-1", "worker-2")
            victim = mesh.workers[int(running.worker_id[-1]) - 1]
            os.kill(victim.process.pid, signal.SIGKILL)
            events = [event async for event in client.stream_run(run.run_id)]
            stored = await client.get_run(run.run_id)
            ended = await delegation_on(
                mesh.workers[2 - int(running.worker_id[-1])].address,
                researching.status.delegation_id,
                mesh.supervisor_token,
            )
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED, events[-1]
    assert [c.url for c in stored.report.citations] == [page]
    ends = [
        e.status
        for e in events
        if e.status.phase
        in (supervisor_pb2.RESEARCH_PHASE_WORKER_COMPLETED, supervisor_pb2.RESEARCH_PHASE_WORKER_FAILED)
    ]
    assert len(ends) == 1 and ends[0].phase == supervisor_pb2.RESEARCH_PHASE_WORKER_COMPLETED, "one correlated end"
    # The delegation went on from its conversation, on the other worker: only the call in flight was asked again.
    assert len(script.requests["Measure the tower"]) == 4
    assert ended is not None and ended.worker_id != running.worker_id
    assert ended.result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED
    assert ended.conversation_id == running.conversation_id


def _script_an_interrupted_measurement(script: Choreography, site: FixtureWeb) -> str:
    """One delegation whose worker reads a page, then makes a call that is never answered (the process
    running it is killed meanwhile); taken up from the recorded conversation, the call is asked again and
    the page read before may be cited. The page's URL."""
    page = f"{site.base_url}/article.html"
    script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Measure the tower"}, "d1"),)),
        Reply(content="The finding suffices."),
    )
    script.add(
        "Measure the tower",
        Reply(calls=(Call("read_web_page", {"url": page}, "r1"),)),
        Await(asyncio.Event(), Reply(content="never sent")),
        Reply(calls=(append_finding("f1", "The tower is 330 m tall.", page, "The tower is 330 metres tall"),)),
        Reply(content="Measured."),
    )
    script.add(REPORT, Reply(content="The tower is 330 m tall [1]."))
    return page


async def test_a_supervisor_killed_between_delegations_does_not_run_the_first_again(
    mesh: ProcessMesh, shared_script: EvidenceScript
) -> None:
    script = shared_script
    script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "First task"}, "d1"),)),
        Await(asyncio.Event(), Reply(content="never sent")),  # in flight when the supervisor dies
        Reply(calls=(Call("delegate_research", {"objective": "Second task"}, "d2"),)),
        Reply(content="Enough."),
    )
    script.add("First task", Reply(content="First done."))
    script.add("Second task", Reply(content="Second done."))
    script.add(REPORT, Reply(content="Both tasks were done."))
    async with RunsClient.connect(mesh.supervisor.address) as client:
        run = await client.start_run("Two tasks, one crash?")
        await _wait_for(lambda: len(script.requests.get(SUPERVISOR, ())) == 2, "the supervisor's second turn")
    _crash_and_restart_the_supervisor(mesh)
    async with RunsClient.connect(mesh.supervisor.address) as client:
        events = [event async for event in client.stream_run(run.run_id)]
        stored = await client.get_run(run.run_id)
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED and stored.report.markdown == "Both tasks were done."
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1))
    # The first delegation's result was recorded with its turn: it is neither run nor asked for again.
    assert len(script.requests["First task"]) == 1 and len(script.requests["Second task"]) == 1
    assert len(script.requests[SUPERVISOR]) == 4, "only the turn in flight was asked again"
    # The turn asked again saw the first delegation's result, as recorded.
    assert any("First done." in result for result in script.tool_results(SUPERVISOR))
    ended = [e.status.delegation_id for e in events if e.status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_COMPLETED]
    assert len(ended) == 2 and len(set(ended)) == 2, "two delegations, each ended once"


async def test_a_supervisor_killed_during_verification_is_taken_up_and_verifies_once(
    mesh: ProcessMesh, site: FixtureWeb, shared_script: EvidenceScript
) -> None:
    script = shared_script
    research(script, site, OPENED)
    supported = verdict("supported", OPENED[2], OPENING[0], "the page gives the opening date")
    verifier_calls = 0

    def held_once(finding: int, site_url: str) -> Step:
        """The verifier's verdict call is in flight when the supervisor dies; asked again, it is answered."""
        nonlocal verifier_calls
        verifier_calls += 1
        return (
            Await(asyncio.Event(), Reply(content="never sent")) if verifier_calls == 1 else supported(finding, site_url)
        )

    script.verdicts = {OPENED[0]: held_once}
    script.add(REPORT, Reply(content=f"## The tower\n\n{S_OPENED}"))
    script.audits = {marked(S_OPENED): ("sound", "")}
    options = supervisor_pb2.RunOptions(verification=supervisor_pb2.VERIFICATION_MODE_ON)
    async with RunsClient.connect(mesh.supervisor.address) as client:
        run = await client.start_run("When did the tower open?", options=options)
        await _wait_for(lambda: verifier_calls == 1, "the verifier's held call")
    _crash_and_restart_the_supervisor(mesh)
    async with RunsClient.connect(mesh.supervisor.address) as client:
        events = [event async for event in client.stream_run(run.run_id)]
        stored = await client.get_run(run.run_id)
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED, events[-1]
    assert stored.report.markdown.startswith(f"## The tower\n\n{S_OPENED}")
    [check] = stored.verification.findings
    assert check.judgement == supervisor_pb2.CLAIM_JUDGEMENT_SUPPORTED
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1))
    # Nothing recorded was asked again: the research, the supervisor's turns; the verifier repeated only the
    # call in flight (its read before it was recorded), and the report was written once, after the takeover.
    [verifier] = [agent for agent in script.requests if agent.startswith("Verify finding ")]
    assert len(script.requests["Research the tower"]) == 3 and len(script.requests[SUPERVISOR]) == 2
    assert len(script.requests[verifier]) == 3 and verifier_calls == 2
    assert len(script.requests[REPORT]) == 1


def _crash_and_restart_the_supervisor(mesh: ProcessMesh) -> None:
    """SIGKILL (no lease released, nothing recorded), then another supervisor process over its database."""
    os.kill(mesh.supervisor.process.pid, signal.SIGKILL)
    assert mesh.supervisor.process.wait(10) == -signal.SIGKILL
    mesh.start_supervisor()
