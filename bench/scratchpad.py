"""Scratchpad benchmark: append throughput and latency, and Watch delivery latency.

    python3 bench/scratchpad.py [--appends 4000] [--backends sqlite,postgresql]
        [--postgres-url postgresql://postgres@127.0.0.1:5432/test]

For each backend it starts `quarry serve scratchpad` as its own process and drives
it over gRPC from separate client processes:
  - 1 client: sequential appends, latency of each;
  - 8 clients: 8 processes appending concurrently to one thread;
  - Watch: a watcher streaming from the thread while one client appends;
    latency is measured from the moment the append is sent to the moment the
    watcher receives the entry, so it includes the commit (an upper bound).
Prints figures only; it never passes or fails on time.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import arguments, mesh_environment, mesh_token, peak_rss_mib, percentile, running_service
from sqlalchemy.engine import make_url

from quarry.identity import MeshRole
from quarry.security import bearer_metadata
from quarry.v1 import common_pb2, scratchpad_pb2, scratchpad_pb2_grpc

AUTHOR = common_pb2.Principal(principal_id="bench", role=common_pb2.ROLE_RESEARCHER)
CONTENT = "A benchmark finding of ordinary size. " * 8  # ~300 bytes
# Researchers' findings come from workers; threads are the supervisor's to create.
AS_WORKER = bearer_metadata(mesh_token(MeshRole.WORKER))
AS_SUPERVISOR = bearer_metadata(mesh_token(MeshRole.SUPERVISOR))


def append_request(thread_id: str, request_id: str, content: str = CONTENT) -> scratchpad_pb2.AppendRequest:
    return scratchpad_pb2.AppendRequest(
        thread_id=thread_id,
        request_id=request_id,
        kind=scratchpad_pb2.ENTRY_KIND_FINDING,
        author=AUTHOR,
        content=content,
        sources=[common_pb2.Source(url="https://example.org/bench", title="bench", excerpt="finding")],
    )


async def _call_many(address: str, thread_id: str, prefix: str, count: int, in_flight: int, noop: bool) -> list[float]:
    """`count` appends (or no-op health checks) over one channel, `in_flight` at a time."""
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        await stub.GetThread(scratchpad_pb2.GetThreadRequest(thread_id=thread_id), metadata=AS_WORKER)  # connect

        async def lane(lane_index: int) -> None:
            for index in range(lane_index, count, in_flight):
                started = time.perf_counter()
                if noop:
                    await health.Check(health_pb2.HealthCheckRequest(), timeout=30)
                else:
                    await stub.Append(append_request(thread_id, f"{prefix}-{index}"), timeout=30, metadata=AS_WORKER)
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(lane(i) for i in range(in_flight)))
    return latencies


def client_process(
    address: str, thread_id: str, prefix: str, count: int, in_flight: int, noop: bool, barrier: Any, results: Any
) -> None:
    barrier.wait()
    started = time.perf_counter()
    latencies = asyncio.run(_call_many(address, thread_id, prefix, count, in_flight, noop))
    results.put((started, time.perf_counter(), latencies))


@dataclass
class CallFigures:
    label: str
    calls: int
    seconds: float
    latencies: list[float]

    def row(self) -> str:
        ms = [value * 1000 for value in self.latencies]
        return (
            f"{self.label:<34} {self.calls:>7} {self.calls / self.seconds:>9.0f} "
            f"{percentile(ms, 0.5):>8.2f} {percentile(ms, 0.99):>8.2f}"
        )


ROUNDS = 6
HEADER = f"{'workload':<34} {'calls':>7} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8}"


def run_clients(
    address: str, thread_id: str, clients: int, total: int, *, in_flight: int = 1, noop: bool = False
) -> CallFigures:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(clients)
    results = context.Queue()
    per_client = total // clients
    processes = [
        context.Process(
            target=client_process,
            args=(address, thread_id, f"{i}-{uuid.uuid4().hex}", per_client, in_flight, noop, barrier, results),
        )
        for i in range(clients)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=600) for _ in processes]
    for process in processes:
        process.join(60)
    begin = min(start for start, _, _ in outcomes)
    end = max(stop for _, stop, _ in outcomes)
    latencies = [value for _, _, values in outcomes for value in values]
    what = "no-op health check" if noop else "append"
    label = f"{what}, {clients} client{'s' if clients > 1 else ''}" + (
        f" x{in_flight} in flight" if in_flight > 1 else ""
    )
    return CallFigures(label, per_client * clients, end - begin, latencies)


async def watch_latency(address: str, thread_id: str, count: int) -> list[float]:
    """Milliseconds from an append being sent to a watcher receiving that entry."""
    sent: dict[str, float] = {}
    received: dict[str, float] = {}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
        request = scratchpad_pb2.GetThreadRequest(thread_id=thread_id)
        after = (await stub.GetThread(request, metadata=AS_WORKER)).thread.last_sequence_no
        call = stub.Watch(scratchpad_pb2.WatchRequest(thread_id=thread_id, after_sequence_no=after), metadata=AS_WORKER)
        await call.initial_metadata()

        async def watch() -> None:
            while len(received) < count:
                response = await call.read()
                received[response.entry.request_id] = time.perf_counter()

        watcher = asyncio.create_task(watch())
        async with grpc.aio.insecure_channel(address) as writer_channel:
            writer = scratchpad_pb2_grpc.ScratchpadServiceStub(writer_channel)
            for index in range(count):
                request_id = f"watch-{index}"
                sent[request_id] = time.perf_counter()
                await writer.Append(append_request(thread_id, request_id), metadata=AS_WORKER)
                await asyncio.sleep(0.002)  # a steady stream, not a burst
        await asyncio.wait_for(watcher, 60)
        call.cancel()
    return [(received[key] - sent[key]) * 1000 for key in sent]


def fresh_postgres_schema(url: str) -> tuple[str, str]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    scoped = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    return scoped.render_as_string(hide_password=False), schema


def drop_postgres_schema(url: str, schema: str) -> None:
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


def bench_backend(name: str, database_url: str, appends: int, watch_count: int) -> None:
    env = {"QUARRY_SCRATCHPAD_DATABASE_URL": database_url, "QUARRY_LOG_LEVEL": "WARNING", **mesh_environment(None)}
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_service("scratchpad", env, Path(workdir)) as (server, address),
    ):
        with grpc.insecure_channel(address) as channel:
            stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
            created = stub.CreateThread(scratchpad_pb2.CreateThreadRequest(title="bench"), metadata=AS_SUPERVISOR)
            thread_id = created.thread.thread_id
        run_clients(address, thread_id, 1, 200)  # warm up
        print(f"\n{name}: one thread, separate client processes")
        print(HEADER)
        for clients in (1, 8):
            print(run_clients(address, thread_id, clients, appends).row(), flush=True)
        print(run_clients(address, thread_id, 1, appends, in_flight=16).row(), flush=True)
        # The same server answering an RPC that does nothing: the gRPC ceiling on this machine.
        for clients in (1, 8):
            print(run_clients(address, thread_id, clients, appends, noop=True).row(), flush=True)
        # The ratio that matters, robust to the machine's drift: the two alternate, round by round.
        rounds: dict[bool, list[CallFigures]] = {False: [], True: []}
        for _ in range(ROUNDS):
            for noop in (False, True):
                rounds[noop].append(run_clients(address, thread_id, 1, appends // ROUNDS, noop=noop))
        rate = {noop: sum(f.calls for f in runs) / sum(f.seconds for f in runs) for noop, runs in rounds.items()}
        print(
            f"{name}: 1 sequential client, {ROUNDS} alternating rounds: append {rate[False]:.0f}/s, no-op "
            f"{rate[True]:.0f}/s, ratio {rate[False] / rate[True]:.2f} (goal >= 0.6)",
            flush=True,
        )
        latencies = asyncio.run(watch_latency(address, thread_id, watch_count))
        print(
            f"{name}: Watch delivery, append sent -> entry received, {watch_count} entries: "
            f"p50 {percentile(latencies, 0.5):.2f} ms, p99 {percentile(latencies, 0.99):.2f} ms, "
            f"max {max(latencies):.2f} ms, mean {statistics.fmean(latencies):.2f} ms"
        )
        print(f"{name}: server peak RSS {peak_rss_mib(server.pid):.0f} MiB")


def main() -> None:
    args = arguments(
        __doc__,
        appends=4000,
        watch_entries=1000,
        backends="sqlite,postgresql",
        postgres_url=os.environ.get("QUARRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, grpcio {grpc.__version__}")
    for backend in args.backends.split(","):
        if backend == "sqlite":
            with tempfile.TemporaryDirectory() as data:
                bench_backend("sqlite", f"sqlite:///{data}/scratchpad.db", args.appends, args.watch_entries)
        elif backend == "postgresql":
            url, schema = fresh_postgres_schema(args.postgres_url)
            try:
                bench_backend("postgresql", url, args.appends, args.watch_entries)
            finally:
                drop_postgres_schema(args.postgres_url, schema)
        else:
            raise SystemExit(f"unknown backend {backend!r}")


if __name__ == "__main__":
    main()
