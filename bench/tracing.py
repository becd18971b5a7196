"""Tracing overhead: the delegate hop, whole research runs and the mesh's CPU time with OpenTelemetry on and off.

    python3 bench/tracing.py [--rounds 5] [--hops 40] [--runs 10]

Two meshes (scratchpad, two workers, supervisor; SQLite) run side by side: one
with tracing off, one exporting every span over OTLP/gRPC to a receiver, a
process of its own (the collector's TraceService from opentelemetry-proto,
counting what it is sent), so decoding the exports does not slow the scripted
model in this process. Each round measures both, in an order that rotates
from round to round: the delegate hop (as bench/run.py does), the wall time of
whole scripted runs of two sequential delegations whose workers read a page
and promote a finding, and the CPU time the mesh's processes spent on them,
including the traced mesh's exports (after each measurement the bench waits
until the receiver has had nothing new for longer than the batch processor's
schedule delay). Prints the median of each per round, and the on/off ratios
taken within each round, as median (range) over the rounds (goal: at most
1.10). Settings such as QUARRY_TRACE_SQL=true, QUARRY_TRACE_HTTP=true or OTEL_TRACES_SAMPLER in the
environment reach the traced mesh only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from harness import arguments
from rounds import Rounds
from run import delegate_hop, researcher, run_once

from quarry.clients.runs import RunsClient
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography
from tests.fakes.openai_server import Call, Reply, ScriptedModel
from tests.fakes.otlp import serving_collector
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.conftest import processes

# Settings that belong to the traced mesh only: the untraced one runs without them.
_TRACING_SETTINGS = ("QUARRY_TRACE_", "OTEL_TRACES_SAMPLER", "OTEL_BSP_")
# The batch span processor's default schedule delay (OTEL_BSP_SCHEDULE_DELAY).
_EXPORT_DELAY_S = 5.0


async def whole_runs(model: ScriptedModel, client: RunsClient, url: str, runs: int) -> list[float]:
    seconds = []
    for n in range(runs):
        choreography = Choreography()
        model.default = choreography
        objectives = [f"Run {n} task {k}" for k in range(2)]
        for objective in objectives:
            researcher(choreography, objective, url, 0.0)
        choreography.add(
            SUPERVISOR,
            *(Reply(calls=(Call("delegate_research", {"objective": o}, f"d{k}"),)) for k, o in enumerate(objectives)),
            Reply(content="Enough."),
        )
        choreography.add(REPORT, Reply(content="The tower stands on the Champ de Mars [1]."))
        started = time.perf_counter()
        await run_once(client, f"Run {n}?")
        seconds.append(time.perf_counter() - started)
    return seconds


def receive(pipe: Connection) -> None:
    """The OTLP receiver's process: sends its endpoint, then the number of spans received when asked."""
    with serving_collector() as (receiver, endpoint):
        pipe.send(endpoint)
        while pipe.recv() == "count":
            pipe.send(len(receiver.spans()))


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of these processes and their children (the workers' page extractors)."""
    total, seen, pending = 0.0, set(), list(pids)
    while pending and len(seen) < 1000:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except FileNotFoundError:  # it ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        pending += [int(child) for child in children]
    return total


async def measure(model: ScriptedModel, client: RunsClient, url: str, args: argparse.Namespace) -> tuple[float, float]:
    """The median delegate hop (ms) and whole run (s) of one mesh."""
    hops = await delegate_hop(model, client, args.hops)
    runs = await whole_runs(model, client, url, args.runs)
    return statistics.median(hops), statistics.median(runs)


async def main_async(args: argparse.Namespace) -> None:
    chosen = {name: value for name, value in os.environ.items() if name.startswith(_TRACING_SETTINGS)}
    for name in chosen:
        del os.environ[name]
    spawn = multiprocessing.get_context("spawn")
    pipe, child_end = spawn.Pipe()
    receiver = spawn.Process(target=receive, args=(child_end,), daemon=True)
    receiver.start()
    endpoint = pipe.recv()
    environments = {"off": {}, "on": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_INSECURE": "true"}}
    environments["on"].update(chosen)
    print(f"traced mesh: {' '.join(f'{k}={v}' for k, v in sorted(environments['on'].items()))}")
    rounds = Rounds("tracing", count=args.rounds)
    try:
        async with ScriptedModel() as model, FixtureWeb() as site, contextlib.AsyncExitStack() as stack:
            url = f"{site.base_url}/article.html"
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            clients, pids = {}, {}
            for label, env in environments.items():
                (workdir / label).mkdir()
                mesh = stack.enter_context(processes(workdir / label, model, site, env))
                services = [mesh.scratchpad, *mesh.workers, mesh.supervisor]
                pids[label] = [service.process.pid for service in services]
                clients[label] = await stack.enter_async_context(RunsClient.connect(mesh.supervisor.address))
                await whole_runs(model, clients[label], url, 1)  # warm-up: page cache, connections, imports
            await settle(pipe)
            for index in rounds:
                for label in rounds.order(["off", "on"], index):
                    cpu = cpu_seconds(pids[label])
                    hop, run = await measure(model, clients[label], url, args)
                    # The traced mesh's exports count in its CPU time; the other waits as long, idling alike.
                    await settle(pipe)
                    rounds.record(f"hop {label}", hop, "ms")
                    rounds.record(f"run {label}", run, "s")
                    rounds.record(f"mesh CPU {label}", cpu_seconds(pids[label]) - cpu, "s")
            spans = await settle(pipe)
    finally:
        pipe.send("stop")
        receiver.join(10)
    rounds.ratio("hop on/off", "hop on", "hop off")
    rounds.ratio("run on/off", "run on", "run off")
    rounds.ratio("mesh CPU on/off", "mesh CPU on", "mesh CPU off")
    rounds.report()
    print(f"spans received from the traced mesh: {spans:,} ({args.hops} hops and {args.runs} runs a round)")


async def settle(pipe: Connection) -> int:
    """Wait until the traced mesh has exported what it had queued (no new span for longer than the batch
    processor's schedule delay), so that the next measurement does not pay for this one's export; the number
    of spans received."""
    received, quiet_since = -1, time.monotonic()
    for _ in range(240):  # at most two minutes
        pipe.send("count")
        now = pipe.recv()
        if now != received:
            received, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since > _EXPORT_DELAY_S + 0.5:
            break
        await asyncio.sleep(0.5)
    return received


def main() -> None:
    asyncio.run(main_async(arguments(__doc__, rounds=5, hops=40, runs=10)))


if __name__ == "__main__":
    main()
