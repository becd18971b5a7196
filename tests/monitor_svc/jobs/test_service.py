"""Submissions and watches of any job (monitor_svc/jobs/service.py): a request_id names one job, across
restarts too; a restarted monitor follows its jobs again; job references and log paths are checked.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import grpc
import pytest

from monitor_svc.jobs.records import JobRecord, to_json
from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.monitor_svc.fake_ssh import FakeHost
from tests.monitor_svc.jobs.helpers import LOSS, Stub, local, script, serving, wait_until_ended, watch_all
from tests.rpc import error_reason, expect_error

# -- request ids and restarts ------------------------------------------------------------------------


async def _wait_for_file(path: Path) -> None:
    for _ in range(600):
        if await asyncio.to_thread(path.exists):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


async def test_a_restarted_monitor_finds_its_jobs_and_never_starts_one_twice(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    body = """\
    with open("launches.txt", "a") as launches:
        launches.write("launched\\n")
    print("loss=0.3", flush=True)
    wait_for(sys.argv[1])
    print("loss=0.25", flush=True)
    sys.exit(3 if sys.argv[1].endswith("fails-meanwhile") else 0)
    """
    path = script(work, body)

    def request(name: str) -> monitor_pb2.SubmitJobRequest:
        command = monitor_pb2.LocalCommand(argv=[sys.executable, path, f"go-{name}"], working_directory=str(work))
        return monitor_pb2.SubmitJobRequest(
            local=command, request_id=name, options=monitor_pb2.JobOptions(metrics=[LOSS])
        )

    async with serving(tmp_path) as before:
        running = await before.SubmitJob(request("running"))
        ends_meanwhile = await before.SubmitJob(request("ends-meanwhile"))
        fails_meanwhile = await before.SubmitJob(request("fails-meanwhile"))
    for name, submitted in (("ends-meanwhile", ends_meanwhile), ("fails-meanwhile", fails_meanwhile)):
        (work / f"go-{name}").touch()
        await asyncio.to_thread(wait_until_ended, submitted.job.local.pid)  # while no monitor runs

    async with serving(tmp_path) as after:
        again = await after.SubmitJob(request("running"))
        assert again.job == running.job, "the same job, found in its record"
        assert (work / "launches.txt").read_text() == "launched\n" * 3, "never started twice"
        other = request("running")
        other.local.argv.append("--more")
        error = await expect_error(after.SubmitJob(other), grpc.StatusCode.ALREADY_EXISTS)
        assert error_reason(error) == "REQUEST_ID_REUSED"
        (work / "go-running").touch()
        # How each ended is known, though no monitor started it: its reaper recorded it.
        last = (await watch_all(after, again.job))[-1].status
        assert (last.state, last.exit_code) == (monitor_pb2.JOB_STATE_COMPLETED, 0), last
        assert "recorded by its reaper" in last.detail
        [loss] = last.metrics
        assert (loss.state, loss.value, loss.best, loss.count) == (monitor_pb2.METRIC_STATE_FOUND, 0.25, 0.25, 2)
        by_id = monitor_pb2.JobRef(monitor_job_id=ends_meanwhile.job.monitor_job_id)
        gone = (await watch_all(after, by_id))[-1].status
        assert (gone.state, gone.exit_code) == (monitor_pb2.JOB_STATE_COMPLETED, 0), gone
        failed = monitor_pb2.JobRef(monitor_job_id=fails_meanwhile.job.monitor_job_id)
        crashed = (await watch_all(after, failed))[-1].status
        assert (crashed.state, crashed.exit_code) == (monitor_pb2.JOB_STATE_FAILED, 3), crashed
        missing = monitor_pb2.JobRef(monitor_job_id="job-0000000000000000")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await watch_all(after, missing)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND and error_reason(raised.value) == "JOB_NOT_FOUND"
    assert (work / "launches.txt").read_text() == "launched\n" * 3


async def test_a_job_signalled_while_no_monitor_runs_is_recorded_and_one_sigkilled_whole_is_unknown(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    path = script(work, "open(sys.argv[1], 'w').close()\nwait_for('never')\n")

    def request(name: str) -> monitor_pb2.SubmitJobRequest:
        command = monitor_pb2.LocalCommand(argv=[sys.executable, path, f"started-{name}"], working_directory=str(work))
        return monitor_pb2.SubmitJobRequest(local=command, request_id=name)

    async with serving(tmp_path) as before:
        stopped = await before.SubmitJob(request("stopped"))
        killed = await before.SubmitJob(request("killed"))
    for name in ("stopped", "killed"):  # running: its reaper is in place
        await _wait_for_file(work / f"started-{name}")
    # The job's group gets the stop; its reaper outlives the job and records the signal.
    os.killpg(stopped.job.local.pid, signal.SIGTERM)
    # SIGKILL to the whole group takes the reaper too: nothing is recorded.
    os.killpg(killed.job.local.pid, signal.SIGKILL)
    for submitted in (stopped, killed):
        await asyncio.to_thread(wait_until_ended, submitted.job.local.pid)
    async with serving(tmp_path) as after:
        by_signal = (await watch_all(after, stopped.job))[-1].status
        unrecorded = (await watch_all(after, killed.job))[-1].status
    assert (by_signal.state, by_signal.exit_code) == (monitor_pb2.JOB_STATE_FAILED, 128 + signal.SIGTERM), by_signal
    assert "killed by signal 15" in by_signal.detail
    assert unrecorded.state == monitor_pb2.JOB_STATE_EXITED and "exit status is unknown" in unrecorded.detail


async def test_retries_while_a_job_starts_get_that_job(monitor: Stub, tmp_path: Path) -> None:
    body = """\
    with open("launches.txt", "a") as launches:
        launches.write("launched\\n")
    """
    request = monitor_pb2.SubmitJobRequest(local=local(tmp_path, body), request_id="retried")
    answers = await asyncio.gather(*(monitor.SubmitJob(request) for _ in range(5)))
    assert answers[0].job.local.pid > 0 and all(answer.job == answers[0].job for answer in answers)
    await watch_all(monitor, answers[0].job)
    assert (tmp_path / "launches.txt").read_text() == "launched\n"


async def test_a_job_whose_start_was_interrupted_is_unknown_and_never_started(tmp_path: Path) -> None:
    # What a monitor that stopped between writing the record and starting the process leaves.
    record = JobRecord("job-00000000000000aa", "interrupted", "digest", "local", argv=["true"])
    directory = tmp_path / "data" / "monitor" / "jobs"
    directory.mkdir(parents=True)
    (directory / "job-00000000000000aa.json").write_text(to_json(record))
    async with serving(tmp_path) as stub:
        [status] = [r.status for r in await watch_all(stub, monitor_pb2.JobRef(monitor_job_id=record.monitor_job_id))]
        request = monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(argv=["true"]), request_id="interrupted")
        error = await expect_error(stub.SubmitJob(request), grpc.StatusCode.ALREADY_EXISTS)
    assert status.state == monitor_pb2.JOB_STATE_UNKNOWN and "whether it started is unknown" in status.detail
    assert error_reason(error) == "REQUEST_ID_REUSED", "its request_id is taken, not started again"


async def test_a_request_id_names_one_job(ssh_monitor: monitor_pb2_grpc.MonitorServiceStub) -> None:
    first = monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(argv=["true"]), request_id="same")
    other = monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(argv=["false"]), request_id="same")
    started = await ssh_monitor.SubmitJob(first)
    assert (await ssh_monitor.SubmitJob(first)).job == started.job
    error = await expect_error(ssh_monitor.SubmitJob(other), grpc.StatusCode.ALREADY_EXISTS)
    assert error_reason(error) == "REQUEST_ID_REUSED"
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await watch_all(ssh_monitor, monitor_pb2.JobRef(local=monitor_pb2.LocalProcess(pid=2**40)))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- bad requests ------------------------------------------------------------------------------------


async def test_bad_job_requests_name_their_fields(ssh_monitor: monitor_pb2_grpc.MonitorServiceStub) -> None:
    await expect_error(
        ssh_monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(argv=["true"]))),
        grpc.StatusCode.INVALID_ARGUMENT,
    )  # no request_id
    for job in (
        monitor_pb2.JobRef(),
        monitor_pb2.JobRef(slurm=monitor_pb2.SlurmJob(host="gpu1", job_id="1; rm -rf /")),
        monitor_pb2.JobRef(remote=monitor_pb2.RemoteProcess(host="gpu1", pid=0)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await watch_all(ssh_monitor, job)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, job
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await watch_all(ssh_monitor, monitor_pb2.JobRef(slurm=monitor_pb2.SlurmJob(host="nowhere", job_id="1")))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_logs_outside_the_configured_roots_are_refused(
    ssh_host: FakeHost, ssh_monitor: monitor_pb2_grpc.MonitorServiceStub
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
            await watch_all(ssh_monitor, job)
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION, job
        assert error_reason(raised.value) == "LOG_PATH_NOT_ALLOWED"
    command = monitor_pb2.LocalCommand(argv=["true"], log_path=str(ssh_host.state.parent / "id_ed25519"))
    error = await expect_error(
        ssh_monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="overwrite")),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert error_reason(error) == "LOG_PATH_NOT_ALLOWED"
