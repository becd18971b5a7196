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


@pytest.mark.slow
async def test_entries_too_large_for_a_payload_reach_a_watcher_on_another_replica(processes: Processes) -> None:
    with postgres_schema() as schema:
        env = {**service_env(schema.url, processes.workdir), **NO_TIMED_READS}
        first, second = await processes.service(env), await processes.service(env)
        async with insecure_channel(first.address) as channel_a, insecure_channel(second.address) as channel_b:
            watching, writing = ScratchpadClient(channel_a), scratchpad_pb2_grpc.ScratchpadServiceStub(channel_b)
            thread_id = (await watching.create_thread(title="large")).thread_id
            opened = asyncio.Event()
            watcher = asyncio.create_task(watch_until(watching, thread_id, 7, opened))
            await asyncio.wait_for(opened.wait(), 30)
            # Through replica B: a small entry (carried whole), then entries of which a payload carries
            # only the first (3,000 bytes of two-byte characters each), then one too large for any.
            await writing.Append(finding(thread_id, "small"))
            await asyncio.gather(*(writing.Append(finding(thread_id, f"large-{i}", "é" * 1500)) for i in range(5)))
            await writing.Append(finding(thread_id, "huge", "x" * 9000))
            stored = (await writing.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id))).entries
            watched = await asyncio.wait_for(watcher, 30)
            assert_gap_free(watched, 7)
            assert watched == list(stored)
            assert watched[-1].request_id == "huge" and watched[-1].content == "x" * 9000


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
        call = scratchpad_pb2_grpc.ScratchpadServiceStub(watcher_channel).Watch(
            scratchpad_pb2.WatchRequest(thread_id=thread_id)
        )
        await call.initial_metadata()
        received: asyncio.Queue[scratchpad_pb2.Entry] = asyncio.Queue()

        async def follow() -> None:
            async for response in call:
                received.put_nowait(response.entry)

        follower = asyncio.create_task(follow())
        await writing.Append(finding(thread_id, "before"))
        assert (await asyncio.wait_for(received.get(), 10)).request_id == "before"

        await replica.listener.stop()  # the NOTIFYs of the next commits never reach this replica
        for request_id in ("lost-1", "lost-2"):
            await writing.Append(finding(thread_id, request_id))
        await asyncio.sleep(0.5)
        assert received.empty(), "nothing but the NOTIFY could have told the watcher"

        replica.listener.start()  # reconnected, it has every follower read again
        assert [(await asyncio.wait_for(received.get(), 10)).request_id for _ in range(2)] == ["lost-1", "lost-2"]
        await writing.Append(finding(thread_id, "after"))
        after = await asyncio.wait_for(received.get(), 10)
        assert (after.request_id, after.sequence_no) == ("after", 4)
        call.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        assert received.empty()
