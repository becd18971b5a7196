"""Watch hands each commit over as committed (in-process, or in another replica's NOTIFY payload) and reads the
rows whenever a delivery cannot continue the stream: every entry arrives once and in order, whatever the path.

Every scratchpad here has no timed re-read (watch_poll_seconds=3600): only deliveries and the fallbacks they
trigger can bring an entry to a watcher.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import ScratchpadSettings
from quarry.migrations import open_migrated_database
from quarry.notify import PostgresCommitListener
from quarry.server import ServiceHost
from quarry.v1 import common_pb2, scratchpad_pb2, scratchpad_pb2_grpc
from scratchpad_svc.service import MIGRATIONS, VERSION_TABLE, open_scratchpad
from scratchpad_svc.servicer import ScratchpadServicer
from tests.conftest import postgres_schema
from tests.scratchpad_svc.conftest import finding
from tests.scratchpad_svc.processes import Processes, assert_gap_free, collect_writers, service_env, watch_until

NO_TIMED_READS = {"QUARRY_SCRATCHPAD_WATCH_POLL_SECONDS": "3600"}
AUTHOR = common_pb2.Principal(principal_id="appender", role=common_pb2.ROLE_RESEARCHER)


async def append_many(client: ScratchpadClient, thread_id: str, prefix: str, count: int, in_flight: int) -> None:
    async def lane(first: int) -> None:
        for index in range(first, count, in_flight):
            await client.append(
                thread_id,
                request_id=f"{prefix}-{index}",
                kind=scratchpad_pb2.ENTRY_KIND_FINDING,
                author=AUTHOR,
                content=f"{prefix} {index}",
            )

    await asyncio.gather(*(lane(first) for first in range(in_flight)))


@pytest.mark.slow
async def test_watchers_get_every_entry_once_in_order_from_appenders_in_processes_and_channels(
    database_url: str, processes: Processes
) -> None:
    writers, per_writer, per_channel = 4, 150, 100
    total = writers * per_writer + 2 * per_channel
    service = await processes.service({**service_env(database_url, processes.workdir), **NO_TIMED_READS})
    async with insecure_channel(service.address) as channel_a, insecure_channel(service.address) as channel_b:
        client_a, client_b = ScratchpadClient(channel_a), ScratchpadClient(channel_b)
        thread_id = (await client_a.create_thread(title="watchers")).thread_id
        opened = [asyncio.Event(), asyncio.Event()]
        watchers = [
            asyncio.create_task(watch_until(client, thread_id, total, event))
            for client, event in zip((client_a, client_b), opened, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in opened)), 30)
        started = processes.start_writers(service.address, thread_id, writers, per_writer)
        appenders = [
            asyncio.create_task(append_many(client, thread_id, name, per_channel, in_flight=4))
            for client, name in ((client_a, "channel-a"), (client_b, "channel-b"))
        ]
        # A third watcher joins midway, from wherever the thread has got to.
        for _ in range(3000):
            joined_after = (await client_b.get_thread(thread_id)).last_sequence_no
            if joined_after >= total // 3:
                break
            await asyncio.sleep(0.01)
        late: list[scratchpad_pb2.Entry] = []
        async for entry in client_b.watch(thread_id, after_sequence_no=joined_after):
            late.append(entry)
            if entry.sequence_no == total:
                break
        await collect_writers(started, 300)
        await asyncio.gather(*appenders)

        stored = await client_a.read_all(thread_id, page_size=500)
        assert_gap_free(stored, total)
        for watcher in watchers:
            assert await asyncio.wait_for(watcher, 60) == stored
        assert late == stored[joined_after:]


class Follower:
    """A Watch from the start of a thread over a raw stub, its entries queued as they arrive."""

    def __init__(self, channel: grpc.aio.Channel, thread_id: str) -> None:
        stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
        self._call = stub.Watch(scratchpad_pb2.WatchRequest(thread_id=thread_id))
        self.received: asyncio.Queue[scratchpad_pb2.Entry] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._call.initial_metadata()
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        async for response in self._call:
            self.received.put_nowait(response.entry)

    async def next(self, count: int) -> list[scratchpad_pb2.Entry]:
        return [await asyncio.wait_for(self.received.get(), 10) for _ in range(count)]

    async def stop(self) -> None:
        self._call.cancel()
        await asyncio.gather(*([self._task] if self._task else []), return_exceptions=True)


@pytest.mark.slow
async def test_entries_too_large_for_a_payload_reach_a_watcher_on_another_replica(processes: Processes) -> None:
    with postgres_schema() as schema:
        env = {**service_env(schema.url, processes.workdir), **NO_TIMED_READS}
        first, second = await processes.service(env), await processes.service(env)
        async with insecure_channel(first.address) as channel_a, insecure_channel(second.address) as channel_b:
            writing = scratchpad_pb2_grpc.ScratchpadServiceStub(channel_b)
            thread_id = (await writing.CreateThread(scratchpad_pb2.CreateThreadRequest(title="large"))).thread.thread_id
            follower = Follower(channel_a, thread_id)
            await follower.start()
            # Each commit goes through replica B to a watcher on replica A that has seen all before it.
            await writing.Append(finding(thread_id, "small"))  # its payload carries it
            assert [entry.request_id for entry in await follower.next(1)] == ["small"]
            await writing.Append(finding(thread_id, "huge", "x" * 9000))  # a payload carries none of it
            assert [entry.content for entry in await follower.next(1)] == ["x" * 9000]
            # 3,000 bytes (of two-byte characters) each: a payload carries two; those that queue behind the
            # first commit together, so the last commit's payload carries only its first entries.
            await asyncio.gather(*(writing.Append(finding(thread_id, f"large-{i}", "é" * 1500)) for i in range(5)))
            watched = [*await follower.next(5)]
            stored = (await writing.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id))).entries
            assert [entry.sequence_no for entry in watched] == [3, 4, 5, 6, 7]
            assert watched == list(stored)[2:]
            await follower.stop()
            assert follower.received.empty()


class Replica:
    """A second scratchpad in this process, served over gRPC, whose NOTIFY listener the test can stop."""

    def __init__(self, address: str, listener: PostgresCommitListener) -> None:
        self.address = address
        self.listener = listener


@pytest.fixture
async def replica(database_url: str, tmp_path: Path) -> AsyncIterator[Replica]:
    settings = ScratchpadSettings(database_url=database_url, watch_poll_seconds=3600)
    database = await open_migrated_database(database_url, MIGRATIONS, VERSION_TABLE)
    scratchpad, listener = await open_scratchpad(database, settings)
    assert listener is not None
    server = grpc.aio.server()
    scratchpad_pb2_grpc.add_ScratchpadServiceServicer_to_server(ScratchpadServicer(scratchpad), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await asyncio.wait_for(listener.connected.wait(), 30)
        yield Replica(f"127.0.0.1:{port}", listener)
    finally:
        await scratchpad.close()
        await server.stop(None)
        await listener.stop()
        await database.close()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_commits_whose_notify_was_lost_reach_the_watcher_when_the_listener_reconnects(
    scratchpad_host: ServiceHost, replica: Replica
) -> None:
    async with (
        insecure_channel(scratchpad_host.address) as writer_channel,
        insecure_channel(replica.address) as watcher_channel,
    ):
        writing = scratchpad_pb2_grpc.ScratchpadServiceStub(writer_channel)
        thread_id = (await writing.CreateThread(scratchpad_pb2.CreateThreadRequest(title="lost"))).thread.thread_id
        follower = Follower(watcher_channel, thread_id)
        await follower.start()
        await writing.Append(finding(thread_id, "before"))
        assert [entry.request_id for entry in await follower.next(1)] == ["before"]

        await replica.listener.stop()  # the NOTIFYs of the next commits never reach this replica
        for request_id in ("lost-1", "lost-2"):
            await writing.Append(finding(thread_id, request_id))
        await asyncio.sleep(0.5)
        assert follower.received.empty(), "nothing but the NOTIFY could have told the watcher"

        replica.listener.start()  # reconnected, it has every follower read again
        assert [entry.request_id for entry in await follower.next(2)] == ["lost-1", "lost-2"]
        await writing.Append(finding(thread_id, "after"))
        [after] = await follower.next(1)
        assert (after.request_id, after.sequence_no) == ("after", 4)
        await follower.stop()
        assert follower.received.empty()
