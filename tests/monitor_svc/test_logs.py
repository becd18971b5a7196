"""Log files that are not what they seem (monitor_svc/logs.py), for jobs here and on an SSH host: FIFOs,
hard links and symlinks out of a log root, a log swapped or truncated during a watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.monitor_svc.jobs.helpers import watch_all
from tests.rpc import error_reason, expect_error

# A FIFO as a log path used to block a thread (local) or a session (SSH) for good; a hard link or a
# symlink inside a log root to a file outside it used to be read. Each watch runs under a generous bound
# so that a regression fails instead of hanging; the `blocked` fixture frees anything left waiting on a
# FIFO so that a failing run still ends.

BOUND = 45.0  # seconds: far beyond a poll, short of the RPC deadline


@pytest.fixture
async def blocked(ssh_monitor: monitor_pb2_grpc.MonitorServiceStub) -> AsyncIterator[list[Path]]:
    """FIFOs a test made; on teardown (before the monitor stops) a writer and a reader open each, so
    that nothing stays blocked opening it."""
    fifos: list[Path] = []
    yield fifos
    for fifo in fifos:
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            with contextlib.suppress(OSError):  # ENXIO: no reader waiting
                os.close(os.open(fifo, flags))


def local_job(log_path: Path) -> monitor_pb2.JobRef:
    return monitor_pb2.JobRef(local=monitor_pb2.LocalProcess(pid=os.getpid()), log_path=str(log_path))


def remote_job(log_path: Path) -> monitor_pb2.JobRef:
    return monitor_pb2.JobRef(remote=monitor_pb2.RemoteProcess(host="gpu1", pid=os.getpid()), log_path=str(log_path))


async def watch_error(stub: monitor_pb2_grpc.MonitorServiceStub, job: monitor_pb2.JobRef) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await asyncio.wait_for(watch_all(stub, job), BOUND)
    return raised.value


def roots(tmp_path: Path) -> dict[str, Path]:
    """The log root of each kind of job in these tests: the monitor's job directory, the host's log root."""
    found = {"local": tmp_path / "jobs", "remote": tmp_path / "logs"}
    for root in found.values():
        root.mkdir(exist_ok=True)
    return found


@pytest.mark.parametrize("kind", ["local", "remote"])
async def test_a_fifo_as_a_log_is_refused_without_blocking(
    kind: str, ssh_monitor: monitor_pb2_grpc.MonitorServiceStub, blocked: list[Path], tmp_path: Path
) -> None:
    fifo = roots(tmp_path)[kind] / "job.log"
    os.mkfifo(fifo)
    blocked.append(fifo)
    job = local_job(fifo) if kind == "local" else remote_job(fifo)
    # Eight at once: as many as used to take every thread (local) or every SSH session (remote).
    errors = await asyncio.gather(*(watch_error(ssh_monitor, job) for _ in range(8)))
    for error in errors:
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
        assert error_reason(error) == "LOG_UNREADABLE"
        assert "not a regular file" in (error.details() or "")
    # ...and the monitor still serves: a watch of a regular log in the same root works.
    regular = fifo.with_name("regular.log")
    regular.write_text("epoch 1\n")
    request = monitor_pb2.WatchJobRequest(job=local_job(regular) if kind == "local" else remote_job(regular))
    first = await asyncio.wait_for(anext(aiter(ssh_monitor.WatchJob(request, timeout=60))), BOUND)
    assert list(first.status.log_tail) == ["epoch 1"]


async def test_a_fifo_as_a_new_jobs_log_is_refused_without_blocking(
    ssh_monitor: monitor_pb2_grpc.MonitorServiceStub, blocked: list[Path], tmp_path: Path
) -> None:
    fifo = roots(tmp_path)["local"] / "new.log"
    os.mkfifo(fifo)
    blocked.append(fifo)
    command = monitor_pb2.LocalCommand(argv=["true"], log_path=str(fifo))
    submitted = ssh_monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="fifo"))
    error = await expect_error(asyncio.wait_for(submitted, BOUND), grpc.StatusCode.FAILED_PRECONDITION)
    assert error_reason(error) == "LOG_UNREADABLE" and "not a regular file" in (error.details() or "")


@pytest.mark.parametrize("kind", ["local", "remote"])
async def test_a_hard_link_in_a_log_root_to_a_file_outside_is_refused(
    kind: str, ssh_monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the private key\n")
    link = roots(tmp_path)[kind] / "job.log"
    os.link(secret, link)
    error = await watch_error(ssh_monitor, local_job(link) if kind == "local" else remote_job(link))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert error_reason(error) == "LOG_PATH_NOT_ALLOWED"
    assert "2 links" in (error.details() or "")
    if kind == "local":  # a job must not append to it either
        command = monitor_pb2.LocalCommand(argv=["echo", "overwritten"], log_path=str(link))
        submitted = ssh_monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="hard-link"))
        error = await expect_error(asyncio.wait_for(submitted, BOUND), grpc.StatusCode.FAILED_PRECONDITION)
        assert error_reason(error) == "LOG_PATH_NOT_ALLOWED"
    assert secret.read_text() == "the private key\n"


@pytest.mark.parametrize("kind", ["local", "remote"])
async def test_a_symlink_in_a_log_root_to_a_file_outside_is_refused(
    kind: str, ssh_monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the private key\n")
    root = roots(tmp_path)[kind]
    (root / "job.log").symlink_to(secret)
    (root / "outside").symlink_to(tmp_path)  # a directory link too: the path goes through it
    for path in (root / "job.log", root / "outside" / "secret.txt"):
        error = await watch_error(ssh_monitor, local_job(path) if kind == "local" else remote_job(path))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, (path, error.details())
        assert error_reason(error) == "LOG_PATH_NOT_ALLOWED"
        assert "the private key" not in (error.details() or "")


@pytest.mark.parametrize("kind", ["local", "remote"])
async def test_a_log_swapped_for_a_symlink_after_the_watch_began_is_refused(
    kind: str, ssh_monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the private key\n")
    log = roots(tmp_path)[kind] / "job.log"
    log.write_text("epoch 1\n")
    job = local_job(log) if kind == "local" else remote_job(log)
    request = monitor_pb2.WatchJobRequest(job=job, poll_interval={"seconds": 1})
    stream = ssh_monitor.WatchJob(request, timeout=60)
    first = await asyncio.wait_for(anext(aiter(stream)), BOUND)
    assert list(first.status.log_tail) == ["epoch 1"]
    log.unlink()
    log.symlink_to(secret)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async with asyncio.timeout(BOUND):
            async for response in stream:
                assert "the private key" not in response.new_log_lines
    assert error_reason(raised.value) == "LOG_PATH_NOT_ALLOWED"


async def test_a_remote_log_truncated_during_a_watch_is_read_again_from_its_start(
    ssh_monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    log = roots(tmp_path)["remote"] / "job.log"
    log.write_text("epoch 1\nepoch 2\n")
    sleeper = await asyncio.create_subprocess_exec("sleep", "60")
    job = monitor_pb2.JobRef(remote=monitor_pb2.RemoteProcess(host="gpu1", pid=sleeper.pid), log_path=str(log))
    stream = ssh_monitor.WatchJob(monitor_pb2.WatchJobRequest(job=job, poll_interval={"seconds": 1}), timeout=60)
    try:
        first = await asyncio.wait_for(anext(aiter(stream)), BOUND)
        assert list(first.status.log_tail) == ["epoch 1", "epoch 2"]
        log.write_text("restarted\n")  # shorter than what was read: rotated
        later = await asyncio.wait_for(anext(aiter(stream)), BOUND)
        assert list(later.new_log_lines) == ["restarted"]
    finally:
        stream.cancel()
        sleeper.kill()
        await sleeper.wait()
