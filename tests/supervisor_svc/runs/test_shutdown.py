"""A stopped run records its end in the time it is given, whatever the scratchpad does: when its
supervisor shuts down (in this process, and as a real process after the scratchpad went first) and on
CancelRun."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from quarry.agent.conversation import ConversationStore
from quarry.agent.model import ModelClient, ModelSettings
from quarry.clients.runs import RunsClient
from quarry.db import Database
from quarry.migrations import upgrade_schema_async
from quarry.v1 import supervisor_pb2
from quarry.vocabulary import Entry
from supervisor_svc.hosting.host import HostLimits
from supervisor_svc.runs.domain import RunErrorCode, RunRecord, RunState, StartRequest
from supervisor_svc.runs.run import RunDependencies
from supervisor_svc.runs.service import Supervisor
from supervisor_svc.runs.store import RunStore
from supervisor_svc.service import MIGRATIONS, VERSION_TABLE
from tests.conftest import stop_service
from tests.fakes.choreography import SUPERVISOR, Choreography
from tests.fakes.openai_server import HttpError, ScriptedModel, Stall
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.conftest import processes

PLANNING = supervisor_pb2.RESEARCH_PHASE_PLANNING


class SilentScratchpad:
    """A research plane that takes the seed, then never answers a read (a scratchpad hung or gone)."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()

    async def create_thread(self, thread_id: str, *, title: str, request_id: str) -> None:
        pass

    async def append(self, thread_id: str, **fields: object) -> None:
        pass

    async def read_all(self, thread_id: str, *, after_sequence_no: int = 0) -> list[Entry]:
        self.reading.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    async def watch(self, thread_id: str, *, after_sequence_no: int = 0) -> AsyncIterator[Entry]:
        await asyncio.Event().wait()
        yield  # type: ignore[misc]  # an async generator that never yields


@dataclass
class Desk:
    supervisor: Supervisor
    store: RunStore
    scratchpad: SilentScratchpad
    script: Choreography

    async def ended(self, run_id: str) -> RunRecord:
        """The run as recorded, with its terminal event checked against it."""
        record = await self.store.get(run_id)
        assert record is not None
        stored = await self.store.events_after(run_id, 0)
        assert stored[-1].terminal, record
        assert [event.sequence_no for event in stored] == list(range(1, len(stored) + 1))
        return record

    async def planning(self, run_id: str) -> None:
        """Until the run has started planning: it is seeded, and its model is being asked."""
        async for stored in await self.supervisor.events(run_id, 0):
            if supervisor_pb2.RunEvent.FromString(stored.payload).status.phase == PLANNING:
                return


@pytest.fixture
async def desk(tmp_path: Path, model: ScriptedModel) -> AsyncIterator[Desk]:
    """A supervisor in this process, its runs seeding a scratchpad that never answers a read."""
    url = f"sqlite:///{tmp_path / 'supervisor.db'}"
    await upgrade_schema_async(url, MIGRATIONS, VERSION_TABLE)
    database = Database(url)
    script = Choreography()
    model.default = script
    client = ModelClient(ModelSettings(base_url=model.base_url, model="scripted", max_attempts=1))
    scratchpad = SilentScratchpad()
    store = RunStore(database)
    deps = RunDependencies(
        model=client,
        conversations=ConversationStore(database),
        scratchpad=scratchpad,  # type: ignore[arg-type]
        delegations=None,  # type: ignore[arg-type]  # no run here delegates
        default_timeout_seconds=300,
        default_parallel=1,
        context_tokens=100_000,
    )
    supervisor = Supervisor(store, deps, HostLimits(max_active=32, stop_wait_seconds=4))
    await supervisor.start()
    try:
        yield Desk(supervisor, store, scratchpad, script)
    finally:
        await supervisor.close(end_within=0)
        await client.close()
        await database.close()


async def test_a_supervisor_closing_leaves_its_runs_to_be_taken_up_whatever_the_scratchpad_does(desk: Desk) -> None:
    desk.script.add(SUPERVISOR, Stall(120))
    run = await desk.supervisor.start_run(StartRequest("Stopped mid-research?"))
    await asyncio.wait_for(desk.planning(run.run_id), 30)
    await asyncio.wait_for(desk.supervisor.close(end_within=1), 30)
    record = await desk.store.get(run.run_id)
    assert record is not None and record.state is RunState.RUNNING and record.end_time is None
    stored = await desk.store.events_after(run.run_id, 0)
    assert not any(event.terminal for event in stored), "nothing ends: another supervisor goes on with it"
    # Its lease is given up: the next sweep of any supervisor takes it up, without waiting out the lease.
    assert await desk.store.expired(datetime.now(UTC) - timedelta(days=1)) == [run.run_id]


async def test_cancel_run_records_the_cancellation_while_the_scratchpad_does_not_answer(desk: Desk) -> None:
    desk.script.add(SUPERVISOR, Stall(120))
    run = await desk.supervisor.start_run(StartRequest("Cancelled mid-research?"))
    await asyncio.wait_for(desk.planning(run.run_id), 30)
    cancelled = await desk.supervisor.cancel(run.run_id, "user pressed Ctrl-C")
    assert cancelled.state is RunState.CANCELLED and cancelled.cancel_reason == "user pressed Ctrl-C"
    await desk.ended(run.run_id)


async def test_a_run_stopped_while_ending_records_the_outcome_it_reached(desk: Desk) -> None:
    desk.script.add(SUPERVISOR, HttpError(400, message="no such model"))
    run = await desk.supervisor.start_run(StartRequest("Failed, then stopped?"))
    # The run has failed at the provider and waits on the scratchpad for the entries its watch missed.
    await asyncio.wait_for(desk.scratchpad.reading.wait(), 30)
    await asyncio.wait_for(desk.supervisor.close(end_within=1), 30)
    record = await desk.ended(run.run_id)
    assert record.state is RunState.FAILED and record.error_code is RunErrorCode.PROVIDER_ERROR


@pytest.mark.slow
@pytest.mark.parametrize("scratchpad_end", ["killed", "frozen"])
async def test_a_supervisor_stopping_after_the_scratchpad_releases_its_runs_in_time(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, scratchpad_end: str
) -> None:
    script = Choreography()
    model.default = script
    script.add(SUPERVISOR, Stall(120))
    with processes(tmp_path, model, site) as mesh:
        scratchpad = mesh.scratchpad.process
        try:
            async with RunsClient.connect(mesh.supervisor.address) as client:
                run = await client.start_run("Interrupted without a scratchpad?")
                async for event in client.stream_run(run.run_id):
                    if event.status.phase == PLANNING:  # seeded, and the model is being asked
                        break
            # The scratchpad goes first: gone (connections refused) or frozen (calls never answered).
            if scratchpad_end == "killed":
                scratchpad.kill()
                scratchpad.wait()
            else:
                os.kill(scratchpad.pid, signal.SIGSTOP)
            status = await asyncio.to_thread(stop_service, mesh.supervisor)
        finally:
            scratchpad.kill()  # a frozen process cannot take SIGTERM
            scratchpad.wait()
        log = mesh.supervisor.log()
    assert status == 0, log
    # The supervisor's own database, read after it exited: no other supervisor swept its lease.
    database = Database(f"sqlite:///{tmp_path / 'supervisor.db'}")
    try:
        store = RunStore(database)
        record = await store.get(run.run_id)
        stored = await store.events_after(run.run_id, 0)
    finally:
        await database.close()
    assert record is not None and record.state is RunState.RUNNING and record.end_time is None, log
    assert not any(event.terminal for event in stored), "the run is left to be taken up, not ended"
    assert [event.sequence_no for event in stored] == list(range(1, len(stored) + 1))
    assert "did not finish within" not in log  # the drain hook ended in its time, not cut short
