"""Tracing overhead: the delegate hop and whole research runs with OpenTelemetry on and off, in one run.

    python3 bench/tracing.py [--rounds 2] [--hops 20] [--runs 5]

The mesh (scratchpad, two workers, supervisor; SQLite) is started once with
tracing off and once exporting every span over OTLP/gRPC to a receiver in this
process, alternating for `rounds` rounds so drift on a shared machine hits both
alike. Each round measures the delegate hop (as bench/run.py does) and the
wall time of whole scripted runs of two sequential delegations whose workers
read a page and promote a finding. Prints p50 of each with tracing off and on,
and the ratio (goal: at most 10% added at p50). Figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from harness import arguments, percentile
from run import delegate_hop, researcher, run_once

from quarry.clients.runs import RunsClient
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography
from tests.fakes.openai_server import Call, Reply, ScriptedModel
from tests.fakes.otlp import serving_collector
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.conftest import processes


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


async def main_async(args: argparse.Namespace) -> None:
    hops: dict[bool, list[float]] = {False: [], True: []}
    runs: dict[bool, list[float]] = {False: [], True: []}
    with serving_collector() as (receiver, endpoint):
        async with ScriptedModel() as model, FixtureWeb() as site:
            tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_INSECURE": "true"}
            url = f"{site.base_url}/article.html"
            for _ in range(args.rounds):
                for traced in (False, True):
                    with (
                        tempfile.TemporaryDirectory() as workdir,
                        processes(Path(workdir), model, site, tracing if traced else None) as mesh,
                    ):
                        async with RunsClient.connect(mesh.supervisor.address) as client:
                            await whole_runs(model, client, url, 1)  # warm-up: page cache, connections, imports
                            hops[traced] += await delegate_hop(model, client, args.hops)
                            runs[traced] += await whole_runs(model, client, url, args.runs)
    print(f"spans received with tracing on: {len(receiver.spans())}")
    for label, values, unit, scale in (("delegate hop", hops, "ms", 1.0), ("whole run", runs, "s", 1.0)):
        off, on = percentile(values[False], 0.5) * scale, percentile(values[True], 0.5) * scale
        print(
            f"{label}: p50 {off:.3f} {unit} off, {on:.3f} {unit} on ({100 * (on / off - 1):+.1f}%; goal <= +10%) "
            f"over {len(values[False])} / {len(values[True])} samples"
        )


def main() -> None:
    asyncio.run(main_async(arguments(__doc__, rounds=2, hops=20, runs=5)))


if __name__ == "__main__":
    main()
