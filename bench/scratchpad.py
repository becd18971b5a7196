"""Scratchpad benchmark: append throughput against a no-op RPC, and Watch delivery latency, per backend.

    python3 bench/scratchpad.py [--rounds 5] [--appends 1200] [--watch-entries 200]
        [--backends sqlite,postgresql] [--postgres-url postgresql://postgres@127.0.0.1:5432/test]
        [--baseline /path/to/another/checkout]

It starts `quarry serve scratchpad` once per backend, each as its own process on
one thread, and drives them over gRPC from 8 client processes started once. Each
round runs every backend's workloads once, in an order that rotates from round
to round:
  - appends from 1 sequential client, from 8 clients at once, and from 1 client
    with 16 in flight;
  - a no-op RPC (the health check) from 1 and from 8 clients: the gRPC ceiling,
    which the append rate is divided by within the round;
  - Watch: a watcher streaming the thread while one client appends; latency runs
    from the append being sent to the watcher receiving its entry (commit included);
  - each backend's bare commit, the floor under an append's latency: on PostgreSQL
    one-row UPDATEs committed one by one (the WAL flush every append waits for), on
    SQLite an append's own transaction on the driver, in a file beside the service's;
    from it and the round's no-op call, the append/no-op ratio an append costing a
    no-op call plus its bare commit would reach (the "bound" figures).
With --baseline, each backend also runs from that checkout's code (its services,
this benchmark's clients), as one more contender in every round; run it from a
directory outside both checkouts (`python -m` puts the working directory first).
At the end a gap check reads each thread back: sequence numbers 1..N with none
missing or repeated, each acknowledged append stored once, and every Watch saw
a run of consecutive numbers. Prints figures only; it never passes or fails on time.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import arguments, mesh_environment, mesh_token, percentile, postgres_schema, running_service
from rounds import Rounds
from sqlalchemy.engine import make_url

from quarry.db import create_engine
from quarry.identity import MeshRole
from quarry.security import bearer_metadata
from quarry.v1 import common_pb2, scratchpad_pb2, scratchpad_pb2_grpc
from scratchpad_svc.schema import metadata

AUTHOR = common_pb2.Principal(principal_id="bench", role=common_pb2.ROLE_RESEARCHER)
CONTENT = "A benchmark finding of ordinary size. " * 8  # ~300 bytes
# Researchers' findings come from workers; threads are the supervisor's to create.
AS_WORKER = bearer_metadata(mesh_token(MeshRole.WORKER))
AS_SUPERVISOR = bearer_metadata(mesh_token(MeshRole.SUPERVISOR))
CLIENTS = 8
ROOT = Path(__file__).resolve().parents[1]
MAX_COMMANDS = 10_000  # a client process's bound; a run sends a few dozen


def append_request(thread_id: str, request_id: str) -> scratchpad_pb2.AppendRequest:
    return scratchpad_pb2.AppendRequest(
        thread_id=thread_id,
        request_id=request_id,
        kind=scratchpad_pb2.ENTRY_KIND_FINDING,
        author=AUTHOR,
        content=CONTENT,
        sources=[common_pb2.Source(url="https://example.org/bench", title="bench", excerpt="finding")],
    )


@dataclass(frozen=True)
class Share:
    """One client's part of a workload: `count` calls over one channel, `in_flight` at a time, from `start_at`."""

    address: str
    thread_id: str
    prefix: str
    count: int
    in_flight: int
    noop: bool
    start_at: float  # time.monotonic(), the same clock in every process


async def _call_many(share: Share) -> tuple[float, float, list[int]]:
    """When the calls began and ended, and the sequence numbers the appends were acknowledged with."""
    acknowledged: list[int] = []
    async with grpc.aio.insecure_channel(share.address) as channel:
        stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        request = scratchpad_pb2.GetThreadRequest(thread_id=share.thread_id)
        await stub.GetThread(request, metadata=AS_WORKER)  # connected before the clock starts
        await asyncio.sleep(max(0.0, share.start_at - time.monotonic()))

        async def lane(lane_index: int) -> None:
            for index in range(lane_index, share.count, share.in_flight):
                if share.noop:
                    await health.Check(health_pb2.HealthCheckRequest(), timeout=30)
                else:
                    request = append_request(share.thread_id, f"{share.prefix}-{index}")
                    response = await stub.Append(request, timeout=30, metadata=AS_WORKER)
                    acknowledged.append(response.entry.sequence_no)

        started = time.monotonic()
        await asyncio.gather(*(lane(i) for i in range(share.in_flight)))
        return started, time.monotonic(), acknowledged


def client_loop(pipe: Connection) -> None:
    """A client process: runs each share it is sent until it is sent None."""
    for _ in range(MAX_COMMANDS):
        share = pipe.recv()
        if share is None:
            return
        pipe.send(asyncio.run(_call_many(share)))


# (figure, clients, calls, in flight, no-op)
Workload = tuple[str, int, int, int, bool]


@dataclass
class Backend:
    name: str
    address: str
    thread_id: str
    acknowledged: list[int] = field(default_factory=list)
    watch_gaps: int = 0


class Clients:
    """CLIENTS client processes, started once: spawning 8 Python processes per workload would cost more
    than the workload."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipes: list[Connection] = []
        self._processes = []
        for _ in range(CLIENTS):
            parent, child = context.Pipe()
            process = context.Process(target=client_loop, args=(child,), daemon=True)
            process.start()
            self._pipes.append(parent)
            self._processes.append(process)

    def calls_per_second(self, backend: Backend, clients: int, total: int, in_flight: int, noop: bool) -> float:
        per_client = total // clients
        start_at = time.monotonic() + 0.3
        for pipe in self._pipes[:clients]:
            prefix = uuid.uuid4().hex
            pipe.send(Share(backend.address, backend.thread_id, prefix, per_client, in_flight, noop, start_at))
        outcomes = []
        for pipe in self._pipes[:clients]:
            if not pipe.poll(300):
                raise RuntimeError("a client process did not answer in 300 s")
            outcomes.append(pipe.recv())
        for _, _, acknowledged in outcomes:
            backend.acknowledged.extend(acknowledged)
        begin = min(start for start, _, _ in outcomes)
        end = max(stop for _, stop, _ in outcomes)
        return per_client * clients / (end - begin)

    def close(self) -> None:
        for pipe in self._pipes:
            pipe.send(None)
        for process in self._processes:
            process.join(30)


async def watch_latency(backend: Backend, count: int) -> list[float]:
    """Milliseconds from an append being sent to a watcher receiving that entry."""
    sent: dict[str, float] = {}
    received: dict[str, float] = {}
    numbers: list[int] = []
    async with grpc.aio.insecure_channel(backend.address) as channel:
        stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
        request = scratchpad_pb2.GetThreadRequest(thread_id=backend.thread_id)
        after = (await stub.GetThread(request, metadata=AS_WORKER)).thread.last_sequence_no
        watch = scratchpad_pb2.WatchRequest(thread_id=backend.thread_id, after_sequence_no=after)
        call = stub.Watch(watch, metadata=AS_WORKER)
        await call.initial_metadata()

        async def follow() -> None:
            while len(received) < count:
                response = await call.read()
                numbers.append(response.entry.sequence_no)
                received[response.entry.request_id] = time.perf_counter()

        watcher = asyncio.create_task(follow())
        async with grpc.aio.insecure_channel(backend.address) as writer_channel:
            writer = scratchpad_pb2_grpc.ScratchpadServiceStub(writer_channel)
            prefix = uuid.uuid4().hex
            for index in range(count):
                request_id = f"watch-{prefix}-{index}"
                sent[request_id] = time.perf_counter()
                response = await writer.Append(append_request(backend.thread_id, request_id), metadata=AS_WORKER)
                backend.acknowledged.append(response.entry.sequence_no)
                await asyncio.sleep(0.002)  # a steady stream, not a burst
        await asyncio.wait_for(watcher, 60)
        call.cancel()
    if numbers != list(range(after + 1, after + count + 1)):
        backend.watch_gaps += 1
    return [(received[key] - sent[key]) * 1000 for key in sent]


def gap_check(backend: Backend) -> str:
    """Whether the thread holds 1..N, each acknowledged append once, and every Watch saw consecutive entries."""
    numbers: list[int] = []
    request_ids: set[str] = set()
    with grpc.insecure_channel(backend.address) as channel:
        stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
        request = scratchpad_pb2.ReadRequest(thread_id=backend.thread_id, page_size=1000)
        for _ in range(100_000):
            page = stub.Read(request, metadata=AS_WORKER)
            numbers.extend(entry.sequence_no for entry in page.entries)
            request_ids.update(entry.request_id for entry in page.entries)
            if not page.next_page_token:
                break
            request = scratchpad_pb2.ReadRequest(thread_id=backend.thread_id, page_token=page.next_page_token)
    dense = numbers == list(range(1, len(numbers) + 1)) and len(request_ids) == len(numbers)
    acknowledged = sorted(backend.acknowledged) == numbers
    verdict = "OK" if dense and acknowledged and not backend.watch_gaps else "FAILED"
    return (
        f"gap check {backend.name}: {len(numbers)} entries, sequence numbers 1..N dense and unique: {dense}; "
        f"{len(backend.acknowledged)} acknowledged appends, each stored once: {acknowledged}; "
        f"Watch runs with a gap or repeat: {backend.watch_gaps}: {verdict}"
    )


class CommitProbe:
    """One-row UPDATEs, each its own transaction, with the server's synchronous_commit: the floor under a
    PostgreSQL append's latency (a commit waits for its WAL flush), measured beside it in each round."""

    def __init__(self, stack: ExitStack, postgres_url: str) -> None:
        url = stack.enter_context(postgres_schema(postgres_url))
        conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._connection = stack.enter_context(psycopg.connect(conninfo, autocommit=True))
        self._connection.execute("CREATE TABLE probe (id int PRIMARY KEY, n bigint NOT NULL)")
        self._connection.execute("INSERT INTO probe VALUES (1, 0)")

    def latencies(self, count: int) -> list[float]:
        """Milliseconds per commit."""
        measured = []
        for _ in range(count):
            started = time.perf_counter()
            self._connection.execute("UPDATE probe SET n = n + 1 WHERE id = 1")
            measured.append((time.perf_counter() - started) * 1000)
        return measured


class SQLiteCommitProbe:
    """An append's own SQLite transaction, with nothing around it: the scratchpad's tables in a file beside
    the bench's, the same PRAGMAs, and on the driver BEGIN IMMEDIATE, the counter's UPDATE, the entry's
    INSERT and COMMIT. The floor under a SQLite append's latency on this disk, measured in each round."""

    def __init__(self, stack: ExitStack) -> None:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        engine = create_engine(f"sqlite:///{workdir}/probe.db")
        stack.callback(engine.dispose)
        metadata.create_all(engine)
        self._connection = stack.enter_context(engine.connect()).connection.dbapi_connection
        assert self._connection is not None
        # As on the service's own write connection: no checkpoint inside a commit (a thread does them there).
        self._connection.execute("PRAGMA wal_autocheckpoint=0")
        self._connection.execute(
            "INSERT INTO scratchpad_threads VALUES ('probe', 'probe', '{}', '2026-01-01 00:00:00', 0, NULL)"
        )
        self._row = ("probe", "bench", "fingerprint", "finding", "bench", "researcher", CONTENT, "[]", "2026-01-01")

    def latencies(self, count: int) -> list[float]:
        """Milliseconds per transaction."""
        execute, measured = self._connection.execute, []
        for _ in range(count):
            started = time.perf_counter()
            execute("BEGIN IMMEDIATE")
            last = execute(
                "UPDATE scratchpad_threads SET last_sequence_no = last_sequence_no + 1 "
                "WHERE thread_id = 'probe' RETURNING last_sequence_no"
            ).fetchone()[0]
            thread, request, *rest = self._row
            execute(
                "INSERT INTO scratchpad_entries (thread_id, sequence_no, request_id, fingerprint, kind, author_id,"
                " author_role, content, sources, create_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (thread, last, f"{request}-{last}", *rest),
            )
            execute("COMMIT")
            measured.append((time.perf_counter() - started) * 1000)
        return measured


def commit_bound(rounds: Rounds, backend: str) -> None:
    """The append/no-op ratio an append would reach if it cost a no-op call plus its bare commit (this
    round's figures): how close the commit alone lets the ratio come to its goal."""
    noop = rounds.values.get(f"{backend} no-op 1 client", [])
    commit = rounds.values.get(f"{backend} commit p50", [])
    if noop and commit:
        noop_ms = 1000 / noop[-1]
        rounds.record(f"{backend} append/no-op bound 1 client", noop_ms / (noop_ms + commit[-1]), "x")


def start_backend(stack: ExitStack, name: str, postgres_url: str, code: str = "") -> Backend:
    """The scratchpad on backend `name`, run from the checkout at `code` (this one when empty)."""
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    if name == "sqlite":
        database_url = f"sqlite:///{workdir}/scratchpad.db"
    elif name == "postgresql":
        database_url = stack.enter_context(postgres_schema(postgres_url))
    else:
        raise SystemExit(f"unknown backend {name!r}; use sqlite and/or postgresql")
    env = {"QUARRY_SCRATCHPAD_DATABASE_URL": database_url, "QUARRY_LOG_LEVEL": "WARNING", **mesh_environment(None)}
    env["PYTHONPATH"] = code or str(ROOT)
    _, address = stack.enter_context(running_service("scratchpad", env, workdir))
    with grpc.insecure_channel(address) as channel:
        stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
        created = stub.CreateThread(scratchpad_pb2.CreateThreadRequest(title="bench"), metadata=AS_SUPERVISOR)
    return Backend(f"{name} (baseline)" if code else name, address, created.thread.thread_id)


def main() -> None:
    args = arguments(
        __doc__,
        rounds=5,
        appends=1200,
        watch_entries=200,
        backends="sqlite,postgresql",
        baseline="",
        postgres_url=os.environ.get("QUARRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, grpcio {grpc.__version__}")
    print(f"{args.appends} calls per workload ({args.appends // 2} for 1 sequential client), CLIENTS={CLIENTS}")
    with ExitStack() as stack:
        if args.baseline and (Path.cwd() / "quarry").is_dir():
            raise SystemExit("with --baseline, run from a directory outside both checkouts")
        codes = ["", args.baseline] if args.baseline else [""]
        backends = [
            start_backend(stack, name, args.postgres_url, code) for name in args.backends.split(",") for code in codes
        ]
        clients = Clients()
        stack.callback(clients.close)
        rounds = Rounds("scratchpad", count=args.rounds)
        # The Watch runs as one more workload.
        workloads: list[Workload] = [
            ("append 1 client", 1, args.appends // 2, 1, False),
            ("append 8 clients", CLIENTS, args.appends, 1, False),
            ("append 1 client x16 in flight", 1, args.appends, 16, False),
            ("no-op 1 client", 1, args.appends // 2, 1, True),
            ("no-op 8 clients", CLIENTS, args.appends, 1, True),
        ]
        for backend in backends:
            clients.calls_per_second(backend, 1, 200, 1, False)  # warm up: connections, caches
            for scale in ("1 client", "8 clients"):
                name = backend.name
                rounds.ratio(f"{name} append/no-op {scale}", f"{name} append {scale}", f"{name} no-op {scale}")
        # A backend's workload, its Watch (no workload), or a backend's commit probe (its name).
        jobs: list[tuple[Backend | str, Workload | None]] = [
            (backend, workload) for backend in backends for workload in [*workloads, None]
        ]
        probes: dict[str, CommitProbe | SQLiteCommitProbe] = {}
        if "sqlite" in args.backends:
            probes["sqlite"] = SQLiteCommitProbe(stack)
        if "postgresql" in args.backends:
            probes["postgresql"] = CommitProbe(stack, args.postgres_url)
        jobs += [(name, None) for name in probes]
        for index in rounds:
            for backend, workload in Rounds.order(jobs, index):
                if isinstance(backend, str):
                    latencies = probes[backend].latencies(args.watch_entries)
                    rounds.record(f"{backend} commit p50", percentile(latencies, 0.5), "ms")
                    rounds.record(f"{backend} commit p99", percentile(latencies, 0.99), "ms")
                elif workload is None:
                    latencies = asyncio.run(watch_latency(backend, args.watch_entries))
                    rounds.record(f"{backend.name} Watch p50", percentile(latencies, 0.5), "ms")
                    rounds.record(f"{backend.name} Watch p99", percentile(latencies, 0.99), "ms")
                else:
                    figure, count, calls, in_flight, noop = workload
                    rate = clients.calls_per_second(backend, count, calls, in_flight, noop)
                    rounds.record(f"{backend.name} {figure}", rate, "calls/s")
            for name in probes:
                commit_bound(rounds, name)
        rounds.report()
        for backend in backends:
            print(gap_check(backend))


if __name__ == "__main__":
    main()
