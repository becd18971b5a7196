"""ExportRun: an ended run's recording, from the supervisor and its workers, as one .qrun file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from quarry.replay import qrun
from supervisor_svc.replay import replay
from tests.fakes.choreography import REPORT, SUPERVISOR
from tests.fakes.openai_server import Await, Call, Reply
from tests.supervisor_svc.conftest import Mesh, researcher


def delegated_once(mesh: Mesh, objective: str, report: str) -> None:
    """The supervisor delegates `objective` (scripted with `researcher`), then has its report written."""
    mesh.script.add(
        SUPERVISOR,
        Reply(content="Delegating.", calls=(Call("delegate_research", {"objective": objective}, "d1"),)),
        Reply(content="The findings suffice."),
    )
    mesh.script.add(REPORT, Reply(content=report, chunks=3))


async def export(mesh: Mesh, run_id: str) -> qrun.RunRecording:
    return qrun.parse(b"".join([piece async for piece in mesh.client.export_run(run_id)]).splitlines())


async def test_an_ended_run_exports_its_events_model_calls_and_fetched_pages_with_their_hashes(mesh: Mesh) -> None:
    researcher(mesh, "Find the height", "/history.html", "The tower opened in 1889.", "to the public in May 1889")
    delegated_once(mesh, "Find the height", "The tower opened in May 1889 [1].")
    run = await mesh.client.start_run("How tall is the Eiffel Tower?")
    events = await mesh.events(run.run_id)
    assert events[-1].HasField("completed"), events[-1]

    recording = await export(mesh, run.run_id)

    assert recording.run_id == run.run_id
    assert recording.run["state"] == "RUN_STATE_SUCCEEDED"
    assert len(recording.events) == len(events)
    assert recording.settings["model_name"] == "scripted"
    chats = [e for e in recording.exchanges if e.url.endswith("/chat/completions")]
    # The supervisor's two turns and its report, the researcher's three turns.
    assert sorted(e.scope == "supervisor" for e in chats) == [False] * 3 + [True] * 3
    assert all(e.status == 200 and e.complete for e in chats)
    [page] = [e for e in recording.exchanges if e.url == f"{mesh.site.base_url}/history.html"]
    assert b"opened to the public in May 1889" in recording.blob(page.body_sha256) and page.status == 200
    # Every body the exchanges refer to is in the file once, under its own hash.
    for exchange in recording.exchanges:
        for digest in (*exchange.request.get("messages", ()), exchange.body_sha256):
            assert qrun.sha256(recording.blob(digest)) == digest


async def test_a_run_is_exported_once_it_has_ended_and_an_unknown_one_is_not_found(mesh: Mesh) -> None:
    held = asyncio.Event()
    mesh.script.add(SUPERVISOR, Await(held, Reply(content="Nothing to research.")))
    mesh.script.add(REPORT, Reply(content="Nothing was researched."))
    run = await mesh.client.start_run("How tall is the Eiffel Tower?")
    with pytest.raises(grpc.aio.AioRpcError) as running:
        await export(mesh, run.run_id)
    assert running.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "once it has ended" in (running.value.details() or "")
    held.set()
    assert (await mesh.events(run.run_id))[-1].HasField("completed")
    assert (await export(mesh, run.run_id)).run["state"] == "RUN_STATE_SUCCEEDED"
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await export(mesh, "run-" + "0" * 32)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # exported from PostgreSQL too, above
async def test_an_exported_run_replays_exactly_with_no_model_and_no_network(mesh: Mesh, tmp_path: Path) -> None:
    researcher(mesh, "Find the date", "/history.html", "The tower opened in 1889.", "opened to the public in May 1889")
    delegated_once(mesh, "Find the date", "The tower opened in May 1889 [1].")
    run = await mesh.client.start_run("When did the Eiffel Tower open?")
    assert (await mesh.events(run.run_id))[-1].HasField("completed")
    recording = await export(mesh, run.run_id)
    asked = sum(len(requests) for requests in mesh.script.requests.values())

    outcome = await replay(recording, tmp_path)

    assert outcome.divergence is None, outcome.divergence
    assert outcome.run["report"]["markdown"] == "The tower opened in May 1889 ." or outcome.run["report"]
    assert sum(len(requests) for requests in mesh.script.requests.values()) == asked  # the model was not asked
