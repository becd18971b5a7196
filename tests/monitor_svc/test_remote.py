"""Remote hosts over a real SSH connection (tests/monitor_svc/fake_ssh.py), Slurm through it, and local jobs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncssh
import grpc
import pytest

from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.monitor_svc.fake_ssh import FakeHost, monitor_for
from tests.rpc import error_reason, expect_error


@pytest.fixture
async def monitor(ssh_host: FakeHost, tmp_path: Path) -> AsyncIterator[monitor_pb2_grpc.MonitorServiceStub]:
    host, channel, stub = await monitor_for(ssh_host.settings(slurm_unknown_polls=3), tmp_path)
    yield stub
    await channel.close(None)
    await host.shutdown()


async def watch_all(stub: monitor_pb2_grpc.MonitorServiceStub, job: monitor_pb2.JobRef, **kwargs: Any) -> list[Any]:
    request = monitor_pb2.WatchJobRequest(job=job, poll_interval={"seconds": 1}, **kwargs)
    return [response async for response in stub.WatchJob(request, timeout=60)]


async def test_gpus_of_a_remote_host_over_ssh_reusing_one_connection(ssh_host: FakeHost, tmp_path: Path) -> None:
    host, channel, stub = await monitor_for(ssh_host.settings(), tmp_path)
    try:
        first = await stub.ListGpus(monitor_pb2.ListGpusRequest(host="gpu1"))
        again = await stub.ListGpus(monitor_pb2.ListGpusRequest(host="gpu1"))
    finally:
        await channel.close(None)
        await host.shutdown()
    assert first.unavailable_reason == "" and len(again.gpus) == 2
    busy, idle = first.gpus
    assert (busy.host, busy.index, busy.uuid, busy.name) == ("gpu1", 0, "GPU-aaaa", "NVIDIA H200")
    assert (busy.memory_used_bytes, busy.memory_total_bytes) == (1024 * 2**20, 143771 * 2**20)
    assert (busy.utilization_percent, busy.temperature_celsius, busy.power_watts) == (87, 61, 312.5)
    assert [(p.pid, p.used_memory_bytes, p.name) for p in busy.processes] == [(4242, 2**30, "python")]
    assert idle.power_watts == 0 and list(idle.processes) == []  # [N/A]: not reported, not an error
    assert len(ssh_host.connections) == 1, "one connection serves every command"
    assert ssh_host.closed, "the connection is closed when the monitor stops"


async def test_malformed_nvidia_smi_output_is_a_clear_error(
    ssh_host: FakeHost, monitor: monitor_pb2_grpc.MonitorServiceStub
) -> None:
    ssh_host.write("gpus.csv", "0, GPU-aaaa, NVIDIA H200, lots, 143771, 87, 61, 312.50\n")
    error = await expect_error(
        monitor.ListGpus(monitor_pb2.ListGpusRequest(host="gpu1")), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert error_reason(error) == "MALFORMED_OUTPUT"
    assert "memory.used is 'lots'" in (error.details() or "") and "GPU-aaaa" in (error.details() or "")


async def test_an_unknown_host_key_is_refused(ssh_host: FakeHost, tmp_path: Path) -> None:
    stranger = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    ssh_host.known_hosts.write_text(f"[127.0.0.1]:{ssh_host.port} {stranger}\n")
    host, channel, stub = await monitor_for(ssh_host.settings(), tmp_path)
    try:
        error = await expect_error(
            stub.ListGpus(monitor_pb2.ListGpusRequest(host="gpu1")), grpc.StatusCode.FAILED_PRECONDITION
        )
    finally:
        await channel.close(None)
        await host.shutdown()
    assert error_reason(error) == "HOST_KEY_UNKNOWN"
    assert "ssh-keyscan" in (error.details() or "")


async def test_a_slurm_job_is_submitted_and_followed_to_its_failure(
    ssh_host: FakeHost, monitor: monitor_pb2_grpc.MonitorServiceStub
) -> None:
    submission = monitor_pb2.SubmitJobRequest(
        slurm=monitor_pb2.SlurmSubmission(host="gpu1", script_path="train.sh", sbatch_args=["--time=01:00:00"]),
        request_id="train-1",
    )
    submitted = await monitor.SubmitJob(submission)
    again = await monitor.SubmitJob(submission)  # a retry: the same job, not a second sbatch
    assert submitted.job.slurm.job_id == "4242" and again.job == submitted.job
    # Its output goes to a log of the monitor's, under the host's first log root.
    output = f"--output={submitted.job.log_path}"
    assert submitted.job.log_path == str(ssh_host.state.parent / "logs" / f"{submitted.job.monitor_job_id}.log")
    assert (ssh_host.state / "sbatch.args").read_text().split() == ["--parsable", "--time=01:00:00", output, "train.sh"]
    ssh_host.write("squeue.txt", "PENDING\n")  # sacct has no record yet: squeue answers

    async def progress() -> None:
        await asyncio.sleep(1.5)
        ssh_host.write("sacct.txt", "4242|RUNNING|0:0|01:00:00\n4242.batch|RUNNING|0:0|\n")
        await asyncio.sleep(1.5)
        ssh_host.write("sacct.txt", "4242|FAILED|3:0|01:00:00\n4242.batch|FAILED|3:0|\n")

    changer = asyncio.create_task(progress())
    # By its Slurm id: what sacct and squeue say, poll by poll (by its monitor id: what the monitor's own poll saw).
    responses = await watch_all(monitor, monitor_pb2.JobRef(slurm=submitted.job.slurm))
    await changer
    states = [r.status.state for r in responses]
    assert states[0] == monitor_pb2.JOB_STATE_PENDING and "squeue" in responses[0].status.detail
    assert monitor_pb2.JOB_STATE_RUNNING in states
    last = responses[-1].status
    assert last.state == monitor_pb2.JOB_STATE_FAILED and last.exit_code == 3
    assert len(states) == len(set(states)), "a response only when something changed"


async def test_a_job_slurm_never_knew_is_given_up(monitor: monitor_pb2_grpc.MonitorServiceStub) -> None:
    job = monitor_pb2.JobRef(slurm=monitor_pb2.SlurmJob(host="gpu1", job_id="777"))
    responses = await watch_all(monitor, job)
    assert responses[-1].status.state == monitor_pb2.JOB_STATE_UNKNOWN
    assert "after 3 polls" in responses[-1].status.detail


async def test_malformed_sacct_output_is_a_clear_error(
    ssh_host: FakeHost, monitor: monitor_pb2_grpc.MonitorServiceStub
) -> None:
    ssh_host.write("sacct.txt", "4242|EXPLODED|0:0|01:00:00\n")
    job = monitor_pb2.JobRef(slurm=monitor_pb2.SlurmJob(host="gpu1", job_id="4242"))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await watch_all(monitor, job)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "unknown Slurm state 'EXPLODED'" in (raised.value.details() or "")


async def test_a_process_on_a_remote_host_and_its_log(
    ssh_host: FakeHost, monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "remote.log"
    log.write_text("epoch 1\n")
    # The SSH server runs on this machine, so a local process is "remote" to the monitor.
    sleeper = await asyncio.create_subprocess_exec("sleep", "60")
    job = monitor_pb2.JobRef(remote=monitor_pb2.RemoteProcess(host="gpu1", pid=sleeper.pid), log_path=str(log))

    async def progress() -> None:
        await asyncio.sleep(1.5)
        with log.open("a") as handle:  # a progress bar's carriage returns, and a line not finished yet
            handle.write("epoch 2\rstill epoch 2\nepoch 3 (unfin")
        await asyncio.sleep(1.5)
        with log.open("a") as handle:
            handle.write("ished)\n")
        await asyncio.sleep(1.5)
        sleeper.send_signal(signal.SIGTERM)
        await sleeper.wait()

    changer = asyncio.create_task(progress())
    responses = await watch_all(monitor, job)
    await changer
    assert responses[0].status.state == monitor_pb2.JOB_STATE_RUNNING
    assert list(responses[0].status.log_tail) == ["epoch 1"]
    new_lines = [line for r in responses[1:] for line in r.new_log_lines]
    assert new_lines == ["epoch 2\rstill epoch 2", "epoch 3 (unfinished)"], "each line once, whole"
    assert responses[-1].status.state == monitor_pb2.JOB_STATE_EXITED
    assert not responses[-1].status.HasField("exit_code"), "another host's process: its status cannot be known"


async def test_a_local_job_that_exits_3_is_failed_with_exit_code_3(
    monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    command = monitor_pb2.LocalCommand(
        argv=[sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(1.5); raise SystemExit(3)"],
        working_directory=str(tmp_path),
    )
    submitted = await monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="local-1"))
    assert submitted.job.local.pid > 0 and submitted.job.log_path
    responses = await watch_all(monitor, submitted.job)
    last = responses[-1].status
    assert last.state == monitor_pb2.JOB_STATE_FAILED and last.exit_code == 3
    seen = [*responses[0].status.log_tail, *(line for r in responses[1:] for line in r.new_log_lines)]
    assert "loading" in seen
    gone = monitor_pb2.JobRef(local=monitor_pb2.LocalProcess(pid=2**22 + 12345))
    [never] = await watch_all(monitor, gone)
    assert never.status.state == monitor_pb2.JOB_STATE_NOT_FOUND


async def test_bad_job_requests_name_their_fields(monitor: monitor_pb2_grpc.MonitorServiceStub) -> None:
    await expect_error(
        monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(argv=["true"]))),
        grpc.StatusCode.INVALID_ARGUMENT,
    )  # no request_id
    for job in (
        monitor_pb2.JobRef(),
        monitor_pb2.JobRef(slurm=monitor_pb2.SlurmJob(host="gpu1", job_id="1; rm -rf /")),
        monitor_pb2.JobRef(remote=monitor_pb2.RemoteProcess(host="gpu1", pid=0)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await watch_all(monitor, job)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, job
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await watch_all(monitor, monitor_pb2.JobRef(slurm=monitor_pb2.SlurmJob(host="nowhere", job_id="1")))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_logs_outside_the_configured_roots_are_refused(
    ssh_host: FakeHost, monitor: monitor_pb2_grpc.MonitorServiceStub
) -> None:
    for job in (
        monitor_pb2.JobRef(local=monitor_pb2.LocalProcess(pid=os.getpid()), log_path="/etc/passwd"),
        monitor_pb2.JobRef(remote=monitor_pb2.RemoteProcess(host="gpu1", pid=os.getpid()), log_path="/etc/passwd"),
        monitor_pb2.JobRef(
            remote=monitor_pb2.RemoteProcess(host="gpu1", pid=os.getpid()),
            log_path=str(ssh_host.state.parent / "logs" / ".." / "id_ed25519"),
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await watch_all(monitor, job)
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION, job
        assert error_reason(raised.value) == "LOG_PATH_NOT_ALLOWED"
    command = monitor_pb2.LocalCommand(argv=["true"], log_path=str(ssh_host.state.parent / "id_ed25519"))
    error = await expect_error(
        monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="overwrite")),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert error_reason(error) == "LOG_PATH_NOT_ALLOWED"


async def test_a_request_id_names_one_job(monitor: monitor_pb2_grpc.MonitorServiceStub) -> None:
    first = monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(argv=["true"]), request_id="same")
    other = monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(argv=["false"]), request_id="same")
    started = await monitor.SubmitJob(first)
    assert (await monitor.SubmitJob(first)).job == started.job
    error = await expect_error(monitor.SubmitJob(other), grpc.StatusCode.ALREADY_EXISTS)
    assert error_reason(error) == "REQUEST_ID_REUSED"
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await watch_all(monitor, monitor_pb2.JobRef(local=monitor_pb2.LocalProcess(pid=2**40)))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- log files that are not what they seem ------------------------------------------------------------
#
# A FIFO as a log path used to block a thread (local) or a session (SSH) for good; a hard link or a
# symlink inside a log root to a file outside it used to be read. Each watch runs under a generous bound
# so that a regression fails instead of hanging; the `blocked` fixture frees anything left waiting on a
# FIFO so that a failing run still ends.

BOUND = 45.0  # seconds: far beyond a poll, short of the RPC deadline


@pytest.fixture
async def blocked(monitor: monitor_pb2_grpc.MonitorServiceStub) -> AsyncIterator[list[Path]]:
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
    kind: str, monitor: monitor_pb2_grpc.MonitorServiceStub, blocked: list[Path], tmp_path: Path
) -> None:
    fifo = roots(tmp_path)[kind] / "job.log"
    os.mkfifo(fifo)
    blocked.append(fifo)
    job = local_job(fifo) if kind == "local" else remote_job(fifo)
    # Eight at once: as many as used to take every thread (local) or every SSH session (remote).
    errors = await asyncio.gather(*(watch_error(monitor, job) for _ in range(8)))
    for error in errors:
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
        assert error_reason(error) == "LOG_UNREADABLE"
        assert "not a regular file" in (error.details() or "")
    # ...and the monitor still serves: a watch of a regular log in the same root works.
    regular = fifo.with_name("regular.log")
    regular.write_text("epoch 1\n")
    request = monitor_pb2.WatchJobRequest(job=local_job(regular) if kind == "local" else remote_job(regular))
    first = await asyncio.wait_for(anext(aiter(monitor.WatchJob(request, timeout=60))), BOUND)
    assert list(first.status.log_tail) == ["epoch 1"]


async def test_a_fifo_as_a_new_jobs_log_is_refused_without_blocking(
    monitor: monitor_pb2_grpc.MonitorServiceStub, blocked: list[Path], tmp_path: Path
) -> None:
    fifo = roots(tmp_path)["local"] / "new.log"
    os.mkfifo(fifo)
    blocked.append(fifo)
    command = monitor_pb2.LocalCommand(argv=["true"], log_path=str(fifo))
    submitted = monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="fifo"))
    error = await expect_error(asyncio.wait_for(submitted, BOUND), grpc.StatusCode.FAILED_PRECONDITION)
    assert error_reason(error) == "LOG_UNREADABLE" and "not a regular file" in (error.details() or "")


@pytest.mark.parametrize("kind", ["local", "remote"])
async def test_a_hard_link_in_a_log_root_to_a_file_outside_is_refused(
    kind: str, monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the private key\n")
    link = roots(tmp_path)[kind] / "job.log"
    os.link(secret, link)
    error = await watch_error(monitor, local_job(link) if kind == "local" else remote_job(link))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert error_reason(error) == "LOG_PATH_NOT_ALLOWED"
    assert "2 links" in (error.details() or "")
    if kind == "local":  # a job must not append to it either
        command = monitor_pb2.LocalCommand(argv=["echo", "overwritten"], log_path=str(link))
        submitted = monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="hard-link"))
        error = await expect_error(asyncio.wait_for(submitted, BOUND), grpc.StatusCode.FAILED_PRECONDITION)
        assert error_reason(error) == "LOG_PATH_NOT_ALLOWED"
    assert secret.read_text() == "the private key\n"


@pytest.mark.parametrize("kind", ["local", "remote"])
async def test_a_symlink_in_a_log_root_to_a_file_outside_is_refused(
    kind: str, monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the private key\n")
    root = roots(tmp_path)[kind]
    (root / "job.log").symlink_to(secret)
    (root / "outside").symlink_to(tmp_path)  # a directory link too: the path goes through it
    for path in (root / "job.log", root / "outside" / "secret.txt"):
        error = await watch_error(monitor, local_job(path) if kind == "local" else remote_job(path))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, (path, error.details())
        assert error_reason(error) == "LOG_PATH_NOT_ALLOWED"
        assert "the private key" not in (error.details() or "")


@pytest.mark.parametrize("kind", ["local", "remote"])
async def test_a_log_swapped_for_a_symlink_after_the_watch_began_is_refused(
    kind: str, monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the private key\n")
    log = roots(tmp_path)[kind] / "job.log"
    log.write_text("epoch 1\n")
    job = local_job(log) if kind == "local" else remote_job(log)
    request = monitor_pb2.WatchJobRequest(job=job, poll_interval={"seconds": 1})
    stream = monitor.WatchJob(request, timeout=60)
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
    monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    log = roots(tmp_path)["remote"] / "job.log"
    log.write_text("epoch 1\nepoch 2\n")
    sleeper = await asyncio.create_subprocess_exec("sleep", "60")
    job = monitor_pb2.JobRef(remote=monitor_pb2.RemoteProcess(host="gpu1", pid=sleeper.pid), log_path=str(log))
    stream = monitor.WatchJob(monitor_pb2.WatchJobRequest(job=job, poll_interval={"seconds": 1}), timeout=60)
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
