"""How soon a run goes on after its supervisor stops: SIGKILL (the lease must lapse) and SIGTERM (released).

    python3 bench/resume.py [--rounds 5] [--lease 2]

A process mesh (scratchpad, two workers, supervisor; SQLite) with the run lease set to `--lease`
seconds. Each round, for each way of stopping (in an order that rotates from round to round), a run
is started whose worker holds its first model call; the supervisor is stopped (SIGKILL, or SIGTERM
and its graceful exit), a new supervisor process is started over the same database, and a client
re-attached to the run's stream times the first event the new process writes for it (the STARTED
status that says it was taken up). Figures per round:

  - start to serving: the new supervisor's launch until it answers health checks;
  - restart to first resumed event: the new supervisor's launch until that event arrives;
  - ... less the lease: the same, less `--lease` (the budget: at most 2 s after a crash).

The held worker call is released after each measurement, and the run finishes before the next.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from pathlib import Path

from harness import arguments
from rounds import Rounds

from quarry.clients.runs import RunsClient
from quarry.v1 import supervisor_pb2
from tests.conftest import stop_service
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography
from tests.fakes.openai_server import Await, Call, Reply, ScriptedModel
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.conftest import ProcessMesh, processes

STOPS = ("sigkill", "sigterm")


async def one_resume(mesh: ProcessMesh, model: ScriptedModel, stop: str) -> tuple[float, float]:
    """(launch to serving, launch to first resumed event) in seconds, for one run stopped by `stop`."""
    script = Choreography()
    model.default = script
    held = asyncio.Event()
    script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Hold on"}, "d1"),)),
        Reply(content="Done."),
    )
    script.add("Hold on", Await(held, Reply(content="never sent")), Reply(content="Held, then done."))
    script.add(REPORT, Reply(content="Resumed."))
    async with RunsClient.connect(mesh.supervisor.address) as client:
        run = await client.start_run(f"Resume after {stop}?")
        last = 0
        async for event in client.stream_run(run.run_id):
            last = event.sequence_no
            if event.status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING:
                break
    if stop == "sigkill":
        os.kill(mesh.supervisor.process.pid, signal.SIGKILL)
        mesh.supervisor.process.wait(10)
    else:
        await asyncio.to_thread(stop_service, mesh.supervisor)
    launched = time.perf_counter()
    await asyncio.to_thread(mesh.start_supervisor)
    serving = time.perf_counter() - launched
    async with RunsClient.connect(mesh.supervisor.address) as client:
        first = 0.0
        async for event in client.stream_run(run.run_id, after_sequence_no=last):
            if not first and event.status.phase == supervisor_pb2.RESEARCH_PHASE_STARTED:  # "taken up again"
                first = time.perf_counter() - launched
                held.set()
            if event.WhichOneof("payload") in ("completed", "failed", "cancelled"):
                if event.WhichOneof("payload") != "completed":
                    raise RuntimeError(f"the resumed run did not succeed: {event}")
                break
    return serving, first


async def main_async(rounds_count: int, lease: float) -> None:
    rounds = Rounds("resume", rounds_count)
    env = {"QUARRY_SUPERVISOR_RUN_LEASE_SECONDS": f"{lease:g}"}
    async with ScriptedModel() as model, FixtureWeb() as site:
        with tempfile.TemporaryDirectory() as workdir, processes(Path(workdir), model, site, env) as mesh:
            for index in rounds:
                for stop in rounds.order(STOPS, index):
                    serving, first = await one_resume(mesh, model, stop)
                    rounds.record(f"{stop}: start to serving", serving, "s")
                    rounds.record(f"{stop}: restart to first resumed event", first, "s")
                    if stop == "sigkill":
                        rounds.record(f"{stop}: restart to first resumed event less the lease", first - lease, "s")
    print(f"goal: the first resumed event at most 2 s plus the lease ({lease:g} s) after a supervisor restarts")
    rounds.report()


def main() -> None:
    args = arguments(__doc__ or "", rounds=5, lease=2.0)
    asyncio.run(main_async(args.rounds, args.lease))


if __name__ == "__main__":
    main()
