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
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from harness import percentile, research_mesh
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from run import delegate_hop, researcher, run_once

from quarry.client import QuarryClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography
from tests.fakes.openai_server import Call, Reply, ScriptedModel
from tests.fakes.web_server import FixtureWeb


class Receiver(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    """Accepts and counts exported spans, as a collector would (on its own threads)."""

    def __init__(self) -> None:
        self.spans = 0

    def Export(self, request: Any, context: Any) -> Any:
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            self.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            return trace_service_pb2.ExportTraceServiceResponse()
        return metrics_service_pb2.ExportMetricsServiceResponse()


async def whole_runs(model: ScriptedModel, client: QuarryClient, url: str, runs: int) -> list[float]:
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
    model, site = ScriptedModel(), FixtureWeb()
    await model.start()
    await site.start()
    receiver = Receiver()
    server = grpc.server(ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tracing = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }
    url = f"{site.base_url}/article.html"
    hops: dict[bool, list[float]] = {False: [], True: []}
    runs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for traced in (False, True):
            with (
                tempfile.TemporaryDirectory() as workdir,
                research_mesh(
                    Path(workdir), model.base_url, f"127.0.0.1:{site.port}", tracing if traced else None
                ) as address,
            ):
                async with QuarryClient.connect(address) as client:
                    await whole_runs(model, client, url, 1)  # warm-up: page cache, connections, imports
                    hops[traced] += await delegate_hop(model, client, args.hops)
                    runs[traced] += await whole_runs(model, client, url, args.runs)
    server.stop(None)
    await site.stop()
    await model.stop()
    print(f"spans received with tracing on: {receiver.spans}")
    for label, values, unit, scale in (("delegate hop", hops, "ms", 1.0), ("whole run", runs, "s", 1.0)):
        off, on = percentile(values[False], 0.5) * scale, percentile(values[True], 0.5) * scale
        print(
            f"{label}: p50 {off:.3f} {unit} off, {on:.3f} {unit} on ({100 * (on / off - 1):+.1f}%; goal <= +10%) "
            f"over {len(values[False])} / {len(values[True])} samples"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hops", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
