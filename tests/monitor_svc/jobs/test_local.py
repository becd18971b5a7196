"""Jobs on this machine (monitor_svc/jobs/local.py): their environment, their command line, their exit
status, their GPUs, and their process group stopped at the wall-clock limit.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import grpc
import pytest

from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.monitor_svc.jobs.helpers import Stub, live_members, local, log_lines, script, serving, watch_all
from tests.monitor_svc.test_gpus import fake_nvml
from tests.rpc import error_reason, expect_error

# -- starting and ending ---------------------------------------------------------------------------


async def test_the_environment_is_given_and_the_monitors_settings_are_not(
    monitor: Stub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The monitor's telemetry settings, the collector's key among them, are not the job's either.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-key=secret")
    body = """\
    print("seed", os.environ["SEED"], flush=True)
    print("quarry settings", sorted(n for n in os.environ if n.startswith(("QUARRY_", "OTEL_"))), flush=True)
    """
    options = monitor_pb2.JobOptions(environment={"SEED": "7 and more"})
    submitted = await monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(local=local(tmp_path, body), request_id="env-1", options=options)
    )
    responses = await watch_all(monitor, submitted.job)
    assert os.environ.get("QUARRY_MESH_INSECURE") == "true"  # the monitor has one
    assert log_lines(responses) == ["seed 7 and more", "quarry settings []"]


async def test_a_command_line_is_split_never_run_by_a_shell(monitor: Stub, tmp_path: Path) -> None:
    command = monitor_pb2.LocalCommand(
        command_line="printf '%s\\n' \"a b\" '$HOME' ';' echo `id`", working_directory=str(tmp_path)
    )
    submitted = await monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="line-1"))
    responses = await watch_all(monitor, submitted.job)
    assert log_lines(responses) == ["a b", "$HOME", ";", "echo", "`id`"]


async def test_a_local_job_that_exits_3_is_failed_with_exit_code_3(
    ssh_monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path_factory: pytest.TempPathFactory
) -> None:
    command = monitor_pb2.LocalCommand(
        argv=[sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(1.5); raise SystemExit(3)"],
        working_directory=str(tmp_path_factory.mktemp("work")),  # outside the monitor's data directory (tmp_path)
    )
    submitted = await ssh_monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="local-1"))
    assert submitted.job.local.pid > 0 and submitted.job.log_path
    responses = await watch_all(ssh_monitor, submitted.job)
    last = responses[-1].status
    assert last.state == monitor_pb2.JOB_STATE_FAILED and last.exit_code == 3
    seen = [*responses[0].status.log_tail, *(line for r in responses[1:] for line in r.new_log_lines)]
    assert "loading" in seen
    gone = monitor_pb2.JobRef(local=monitor_pb2.LocalProcess(pid=2**22 + 12345))
    [never] = await watch_all(ssh_monitor, gone)
    assert never.status.state == monitor_pb2.JOB_STATE_NOT_FOUND


# -- wall-clock limits -----------------------------------------------------------------------------


async def test_a_sleep_past_its_wall_clock_limit_is_timed_out(monitor: Stub, tmp_path: Path) -> None:
    command = monitor_pb2.LocalCommand(command_line="sleep 60", working_directory=str(tmp_path))
    options = monitor_pb2.JobOptions(wall_clock_limit={"seconds": 1})
    submitted = await monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(local=command, request_id="sleep-1", options=options)
    )
    last = (await watch_all(monitor, submitted.job))[-1].status
    assert last.state == monitor_pb2.JOB_STATE_TIMED_OUT, last.detail
    assert "wall-clock limit of 1 s: SIGTERM" in last.detail and "SIGKILL" not in last.detail
    assert not last.HasField("exit_code")
    assert live_members(submitted.job.local.pid) == []


async def test_a_job_ignoring_sigterm_is_killed_with_its_children(monitor: Stub, tmp_path: Path) -> None:
    body = """\
    import signal, subprocess
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "60"])
    print("child", child.pid, flush=True)
    time.sleep(60)
    """
    # A limit long enough for the job to have set SIGTERM aside on a loaded machine: before that, SIGTERM
    # alone would end it.
    options = monitor_pb2.JobOptions(wall_clock_limit={"seconds": 3})
    submitted = await monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(local=local(tmp_path, body), request_id="stubborn-1", options=options)
    )
    responses = await watch_all(monitor, submitted.job)
    last = responses[-1].status
    assert last.state == monitor_pb2.JOB_STATE_TIMED_OUT
    assert "SIGKILL after a 1 s grace" in last.detail
    child = int(next(line for line in log_lines(responses) if line.startswith("child")).split()[1])
    assert live_members(submitted.job.local.pid) == [], "the job's whole process group is gone"
    assert child not in live_members(submitted.job.local.pid)


# -- GPUs ------------------------------------------------------------------------------------------


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = fake_nvml()
    used = {0: 5 * 2**30, 1: 2**30}  # GPU 1 is the less used one
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(total=141 * 2**30, used=used[handle])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


async def test_jobs_get_different_free_gpus_and_one_too_many_is_refused(nvml: types.ModuleType, tmp_path: Path) -> None:
    body = """\
    print("devices", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["CUDA_DEVICE_ORDER"], flush=True)
    wait_for(sys.argv[1])
    """
    path = script(tmp_path, body)

    def submit(name: str, gpus: monitor_pb2.GpuRequest) -> Any:
        command = monitor_pb2.LocalCommand(argv=[sys.executable, path, f"done-{name}"], working_directory=str(tmp_path))
        options = monitor_pb2.JobOptions(gpus=gpus)
        return stub.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id=name, options=options))

    async with serving(tmp_path) as stub:
        first = await submit("a", monitor_pb2.GpuRequest(count=1))
        second = await submit("b", monitor_pb2.GpuRequest(count=1))
        assert list(first.gpu_indices) == [1], "the least used GPU first"
        assert list(second.gpu_indices) == [0]
        busy = await expect_error(submit("c", monitor_pb2.GpuRequest(count=1)), grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert error_reason(busy) == "GPUS_BUSY" and "0 of the 2 GPU(s)" in (busy.details() or "")
        taken = await expect_error(submit("d", monitor_pb2.GpuRequest(indices=[0])), grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert error_reason(taken) == "GPUS_BUSY"
        for request in (monitor_pb2.GpuRequest(indices=[5]), monitor_pb2.GpuRequest(count=3)):
            error = await expect_error(submit("e", request), grpc.StatusCode.FAILED_PRECONDITION)
            assert error_reason(error) == "GPUS_UNAVAILABLE"
        (tmp_path / "done-a").touch()
        ended = await watch_all(stub, first.job)
        assert "devices 1 PCI_BUS_ID" in log_lines(ended)
        # Its GPU is free again once it has ended.
        third = await submit("c", monitor_pb2.GpuRequest(count=1))
        assert list(third.gpu_indices) == [1]
        (tmp_path / "done-b").touch()
        (tmp_path / "done-c").touch()
        for job in (second.job, third.job):
            assert (await watch_all(stub, job))[-1].status.state == monitor_pb2.JOB_STATE_COMPLETED


async def test_a_gpu_reservation_outlives_a_monitor_restart(nvml: types.ModuleType, tmp_path: Path) -> None:
    path = script(tmp_path, "wait_for(sys.argv[1])\n")

    def submit(stub: Stub, name: str) -> Any:
        command = monitor_pb2.LocalCommand(argv=[sys.executable, path, f"done-{name}"], working_directory=str(tmp_path))
        options = monitor_pb2.JobOptions(gpus=monitor_pb2.GpuRequest(count=2))
        return stub.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id=name, options=options))

    async with serving(tmp_path) as stub:
        first = await submit(stub, "a")
        assert list(first.gpu_indices) == [0, 1]
    # Another monitor on the same records: the job runs on, and its GPUs are still its own.
    async with serving(tmp_path) as stub:
        busy = await expect_error(submit(stub, "b"), grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert error_reason(busy) == "GPUS_BUSY"
        (tmp_path / "done-a").touch()
        assert (await watch_all(stub, first.job))[-1].status.state == monitor_pb2.JOB_STATE_COMPLETED
        second = await submit(stub, "b")
        assert list(second.gpu_indices) == [0, 1]
        (tmp_path / "done-b").touch()
        assert (await watch_all(stub, second.job))[-1].status.state == monitor_pb2.JOB_STATE_COMPLETED
