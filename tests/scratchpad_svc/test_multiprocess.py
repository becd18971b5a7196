"""The scratchpad as a real process, written by real client processes.

These are the slow tests (`-m slow`); each runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time

import pytest

from quarry.clients.channels import insecure_channel
from quarry.clients.retry import RetryPolicy
from quarry.clients.scratchpad import ScratchpadClient
from quarry.v1 import common_pb2, scratchpad_pb2
from tests.conftest import postgres_schema, reusable_port
from tests.scratchpad_svc.processes import Processes, assert_gap_free, collect_writers, service_env, watch_until

pytestmark = pytest.mark.slow


async def tail_with_reads(client: ScratchpadClient, thread_id: str, count: int) -> list[int]:
    """A reader that keeps resuming "after the last sequence number I saw" while writers write."""
    seen: list[int] = []
    for _ in range(100_000):  # bounded; each round sleeps briefly when nothing is new
        entries = await client.read_all(thread_id, after_sequence_no=seen[-1] if seen else 0, page_size=97)
        seen.extend(entry.sequence_no for entry in entries)
        if len(seen) >= count:
            return seen
        if not entries:
            await asyncio.sleep(0.005)
    raise AssertionError(f"reader saw only {len(seen)} of {count}")


async def test_eight_writer_processes_get_one_gap_free_order(database_url: str, processes: Processes) -> None:
    writers, per_writer = 8, 100
    total = writers * per_writer
    service = await processes.service(service_env(database_url, processes.workdir))
    async with insecure_channel(service.address) as channel:
        client = ScratchpadClient(channel)
        thread = await client.create_thread(title="eight writers")
        opened = asyncio.Event()
        watcher = asyncio.create_task(watch_until(client, thread.thread_id, total, opened))
        await asyncio.wait_for(opened.wait(), 30)  # the Watch is live before the first writer starts
        tailers = [asyncio.create_task(tail_with_reads(client, thread.thread_id, total)) for _ in range(2)]
        started = processes.start_writers(service.address, thread.thread_id, writers, per_writer)
        outputs = await collect_writers(started, 300)

        acknowledged = [record["seq"] for output in outputs for record in output]
        assert sorted(acknowledged) == list(range(1, total + 1))
        for output in outputs:
            sequence = [record["seq"] for record in output]
            assert sequence == sorted(sequence), "one writer's appends committed out of order"

        stored = await client.read_all(thread.thread_id, page_size=333)
        assert_gap_free(stored, total)
        by_request = {entry.request_id: entry.sequence_no for entry in stored}
        for output in outputs:
            for record in output:
                assert by_request[record["request_id"]] == record["seq"]

        for tailer in tailers:
            assert await asyncio.wait_for(tailer, 60) == list(range(1, total + 1))
        watched = await asyncio.wait_for(watcher, 60)
        assert_gap_free(watched, total)
        assert [e.request_id for e in watched] == [e.request_id for e in stored]
    processes.assert_services_stop_cleanly()


async def test_writers_survive_sigkill_and_restart_without_loss_or_duplicates(
    database_url: str, processes: Processes
) -> None:
    writers, per_writer = 8, 120
    total = writers * per_writer
    port = reusable_port()
    env = service_env(database_url, processes.workdir)
    service = await processes.service(env, port=port)
    async with insecure_channel(service.address) as channel:
        client = ScratchpadClient(channel, RetryPolicy(total_seconds=90, max_backoff=0.5))
        thread = await client.create_thread(title="crash")
        opened = asyncio.Event()
        watcher = asyncio.create_task(watch_until(client, thread.thread_id, total, opened))
        await asyncio.wait_for(opened.wait(), 30)
        started = processes.start_writers(service.address, thread.thread_id, writers, per_writer)

        # Kill the server hard in the middle of the writes.
        for _ in range(6000):
            written_before_kill = (await client.get_thread(thread.thread_id)).last_sequence_no
            if written_before_kill >= total // 3:
                break
            await asyncio.sleep(0.01)
        service.process.send_signal(signal.SIGKILL)
        service.process.wait(10)
        assert await asyncio.to_thread(_wait_port_free, port)
        await processes.service(env, port=port)

        outputs = await collect_writers(started, 300)
        assert total // 3 <= written_before_kill < total, "the kill did not land in the middle of the writes"
        stored = await client.read_all(thread.thread_id, page_size=1000)
        assert_gap_free(stored, total)
        expected = {f"w{writer}-{index}" for writer in range(writers) for index in range(per_writer)}
        assert {entry.request_id for entry in stored} == expected
        by_request = {entry.request_id: entry.sequence_no for entry in stored}
        for output in outputs:
            for record in output:
                assert by_request[record["request_id"]] == record["seq"]
        # The watch reconnected after the kill and resumed from its last entry.
        watched = await asyncio.wait_for(watcher, 60)
        assert_gap_free(watched, total)
    processes.assert_services_stop_cleanly()


def _wait_port_free(port: int) -> bool:
    for _ in range(200):
        with socket.socket() as sock:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
                return True
            except OSError:
                time.sleep(0.05)
    return False


async def test_two_replicas_on_one_postgres_share_one_order_and_wake_each_others_watchers(
    processes: Processes,
) -> None:
    writers, per_writer = 4, 100
    total = writers * per_writer
    with postgres_schema() as schema:
        # Watchers never re-read on a timer here: only NOTIFY from the other replica can wake them.
        env = {**service_env(schema.url, processes.workdir), "QUARRY_SCRATCHPAD_WATCH_POLL_SECONDS": "3600"}
        first = await processes.service(env)
        second = await processes.service(env)
        async with insecure_channel(first.address) as channel_a, insecure_channel(second.address) as channel_b:
            client_a, client_b = ScratchpadClient(channel_a), ScratchpadClient(channel_b)
            thread = await client_a.create_thread(title="replicas")
            # The watcher is on replica A; half the writers write through replica B.
            opened = asyncio.Event()
            watcher = asyncio.create_task(watch_until(client_a, thread.thread_id, total + 1, opened))
            await asyncio.wait_for(opened.wait(), 30)
            started = [
                *processes.start_writers(first.address, thread.thread_id, writers // 2, per_writer),
                *processes.start_writers(
                    second.address, thread.thread_id, writers // 2, per_writer, first_writer=writers // 2
                ),
            ]
            await collect_writers(started, 300)
            # The last entry goes through replica B alone, after every other write.
            await client_b.append(
                thread.thread_id,
                request_id="last",
                kind=scratchpad_pb2.ENTRY_KIND_NOTE,
                author=common_pb2.Principal(principal_id="b", role=common_pb2.ROLE_RESEARCHER),
                content="written through replica B",
            )
            assert_gap_free(await client_b.read_all(thread.thread_id), total + 1)
            watched = await asyncio.wait_for(watcher, 60)
            assert_gap_free(watched, total + 1)
            assert watched[-1].request_id == "last"
            # Retrying through the other replica returns the original entry.
            original = next(entry for entry in watched if entry.request_id == "w0-0")
            again = await client_b.append(
                thread.thread_id,
                request_id="w0-0",
                kind=original.kind,
                author=original.author,
                content=original.content,
                sources=list(original.sources),
            )
            assert again.replayed and again.entry == original
        processes.assert_services_stop_cleanly()
