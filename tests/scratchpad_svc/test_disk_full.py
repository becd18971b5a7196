"""A scratchpad process whose disk fills up: appends fail naming the cause, health turns NOT_SERVING, nothing
committed is lost, and it serves again once there is room (a real full disk: a small tmpfs)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.clients.channels import insecure_channel
from quarry.clients.retry import RetryPolicy
from quarry.clients.scratchpad import ScratchpadClient
from quarry.v1 import common_pb2, scratchpad_pb2
from tests.rpc import error_reason
from tests.scratchpad_svc.processes import Processes, service_env

pytestmark = pytest.mark.slow

AUTHOR = common_pb2.Principal(principal_id="writer", role=common_pb2.ROLE_RESEARCHER)


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at `path`: a disk that really fills up."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


async def _health(address: str) -> int:
    # A bare channel: Quarry's own channels check health themselves and refuse every call, Check included,
    # to a backend that is NOT_SERVING.
    async with grpc.aio.insecure_channel(address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(response.status)


async def _becomes(address: str, status: int) -> None:
    for _ in range(100):  # the host asks its checks every 2 s
        if await _health(address) == status:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"health never became {status}")


async def test_a_full_disk_fails_appends_clearly_turns_health_off_and_loses_nothing(
    tmp_path: Path, processes: Processes
) -> None:
    with small_disk(tmp_path / "disk", "2m") as disk:
        database = disk / "scratchpad.db"
        service = await processes.service(service_env(f"sqlite:///{database}", tmp_path))
        async with insecure_channel(service.address) as channel:
            client = ScratchpadClient(channel, RetryPolicy(total_seconds=0))  # one attempt: see each failure
            thread = await client.create_thread(title="until the disk is full")
            filler = disk / "filler"
            filler.write_bytes(b"\0" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - 64 * 1024))
            acknowledged: list[int] = []
            refused: grpc.aio.AioRpcError | None = None
            for n in range(2000):
                try:
                    appended = await client.append(
                        thread.thread_id, kind=scratchpad_pb2.ENTRY_KIND_NOTE, author=AUTHOR, content=f"{n} " * 500
                    )
                except grpc.aio.AioRpcError as error:
                    refused = error
                    break
                acknowledged.append(appended.entry.sequence_no)
            assert refused is not None, "the disk never filled"
            assert refused.code() == grpc.StatusCode.UNAVAILABLE
            assert error_reason(refused) == "DATABASE_DISK_FULL"
            assert str(database) in (refused.details() or "")
            await _becomes(service.address, health_pb2.HealthCheckResponse.NOT_SERVING)

            filler.unlink()  # room again: the service serves again, and the next write succeeds
            await _becomes(service.address, health_pb2.HealthCheckResponse.SERVING)
            after = await client.append(
                thread.thread_id, kind=scratchpad_pb2.ENTRY_KIND_NOTE, author=AUTHOR, content="after"
            )
            stored = [entry.sequence_no for entry in await client.read_all(thread.thread_id)]
        assert stored == [*acknowledged, after.entry.sequence_no], "every acknowledged append is kept, without gaps"
        assert stored == list(range(1, len(stored) + 1))
        processes.assert_services_stop_cleanly()
