"""Experiment jobs over real gRPC and real processes: metrics read by code, wall-clock limits, GPU choice,
durable records a restarted monitor finds again, and the same on an SSH host and through Slurm.

Jobs are tiny Python scripts. A script that must still be running when the test acts waits for a file
the test creates (never for a time), bounded so that a failing test cannot leave it behind.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import textwrap
import time
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from monitor_svc.records import JobRecord, to_json
from monitor_svc.service import build_host
from quarry.clients.channels import insecure_channel
from quarry.config import MonitorSettings, QuarrySettings
from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.monitor_svc.fake_ssh import FakeHost
from tests.monitor_svc.test_gpus import fake_nvml
from tests.rpc import error_reason, expect_error, violations

Stub = monitor_pb2_grpc.MonitorServiceStub

LOSS = monitor_pb2.MetricSpec(
    name="loss", direction=monitor_pb2.METRIC_DIRECTION_MINIMIZE, log_regex=r"loss=([0-9.a-z]+)"
)
WAIT_FOR = """\
import os, sys, time
def wait_for(name):
    deadline = time.time() + 60
    while not os.path.exists(name) and time.time() < deadline:
        time.sleep(0.05)
"""


def settings(**overrides: Any) -> MonitorSettings:
    values: dict[str, Any] = {
        "address": "127.0.0.1:0",
        "allow_job_submission": True,
        "job_poll_seconds": 0.2,
        "job_stop_grace_seconds": 1.0,
    }
    values.update(overrides)
    return MonitorSettings(**values)


@asynccontextmanager
async def serving(data_dir: Path, monitor_settings: MonitorSettings | None = None) -> AsyncIterator[Stub]:
    host = await build_host(monitor_settings or settings(), QuarrySettings(data_dir=data_dir))
    async with host, insecure_channel(host.address) as channel:
        yield monitor_pb2_grpc.MonitorServiceStub(channel)


@pytest.fixture
async def monitor(tmp_path: Path) -> AsyncIterator[Stub]:
    async with serving(tmp_path) as stub:
        yield stub


def script(directory: Path, body: str, name: str = "job.py") -> str:
    path = directory / name
    path.write_text(WAIT_FOR + textwrap.dedent(body))
    return str(path)


def local(directory: Path, body: str, **fields: Any) -> monitor_pb2.LocalCommand:
    return monitor_pb2.LocalCommand(
        argv=[sys.executable, script(directory, body)], working_directory=str(directory), **fields
    )


async def watch_all(stub: Stub, job: monitor_pb2.JobRef) -> list[monitor_pb2.WatchJobResponse]:
    request = monitor_pb2.WatchJobRequest(job=job, poll_interval={"seconds": 1})
    return [response async for response in stub.WatchJob(request, timeout=60)]


def points(responses: list[monitor_pb2.WatchJobResponse]) -> list[tuple[str, float, int]]:
    return [(p.name, p.value, p.step) for r in responses for p in r.metric_points]


def log_lines(responses: list[monitor_pb2.WatchJobResponse]) -> list[str]:
    return [*responses[0].status.log_tail, *(line for r in responses[1:] for line in r.new_log_lines)]


def live_members(pgid: int) -> list[int]:
    """Processes of the group that still run (a zombie waiting for its reaper has ended)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def wait_until_ended(pgid: int) -> None:
    for _ in range(1200):  # a minute at most
        if not live_members(pgid):
            return
        time.sleep(0.05)
    raise AssertionError(f"process group {pgid} still runs")


# -- metrics --------------------------------------------------------------------------------------


async def test_log_metrics_are_reported_as_they_appear_and_evaluated_at_the_end(monitor: Stub, tmp_path: Path) -> None:
    body = """\
    print("epoch 1 loss=0.5", flush=True)
    print("no metric here", flush=True)
    print("epoch 2 loss=0.4", flush=True)
    wait_for("go")
    print("epoch 3 loss=0.45", flush=True)
    print("final loss=nan", flush=True)
    """
    # A command line, split into arguments: never run by a shell.
    command = monitor_pb2.LocalCommand(
        command_line=shlex.join([sys.executable, script(tmp_path, body)]), working_directory=str(tmp_path)
    )
    submitted = await monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(
            local=command, request_id="metrics-1", options=monitor_pb2.JobOptions(metrics=[LOSS])
        )
    )
    assert submitted.job.monitor_job_id
    stream = monitor.WatchJob(monitor_pb2.WatchJobRequest(job=submitted.job, poll_interval={"seconds": 1}), timeout=60)
    responses = []
    async for response in stream:
        responses.append(response)
        if len(points(responses)) == 2 and not (tmp_path / "go").exists():
            assert response.status.state == monitor_pb2.JOB_STATE_RUNNING, "seen while the job runs"
            (tmp_path / "go").touch()
    assert points(responses) == [("loss", 0.5, 1), ("loss", 0.4, 3), ("loss", 0.45, 4)]
    last = responses[-1].status
    assert last.state == monitor_pb2.JOB_STATE_COMPLETED and last.exit_code == 0
    [loss] = last.metrics
    assert (loss.name, loss.state, loss.value, loss.best, loss.count) == (
        "loss",
        monitor_pb2.METRIC_STATE_FOUND,
        0.45,
        0.4,
        3,
    )
    assert "1 match(es) were not numbers" in loss.detail
    assert all(not r.status.metrics for r in responses[:-1]), "metrics are evaluated once the job has ended"


async def test_json_lines_metrics_are_read_when_the_job_ends(monitor: Stub, tmp_path: Path) -> None:
    body = """\
    import json
    with open("metrics.jsonl", "w") as out:
        for line in ({"step": 10, "acc": 0.5}, {"step": 20, "acc": 0.7}, "not an object", {"acc": "high"}):
            out.write(json.dumps(line) + "\\n")
        out.write("{not json\\n")
        out.write(json.dumps({"step": 30, "acc": 0.6}) + "\\n")
    """
    accuracy = monitor_pb2.MetricSpec(
        name="acc",
        direction=monitor_pb2.METRIC_DIRECTION_MAXIMIZE,
        jsonl_file=monitor_pb2.JsonlMetric(path="metrics.jsonl", key="acc"),
    )
    missing = monitor_pb2.MetricSpec(
        name="f1",
        direction=monitor_pb2.METRIC_DIRECTION_MAXIMIZE,
        jsonl_file=monitor_pb2.JsonlMetric(path="eval/f1.jsonl", key="f1"),
    )
    options = monitor_pb2.JobOptions(metrics=[accuracy, missing])
    submitted = await monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(local=local(tmp_path, body), request_id="jsonl-1", options=options)
    )
    last = (await watch_all(monitor, submitted.job))[-1].status
    assert last.state == monitor_pb2.JOB_STATE_COMPLETED
    acc, f1 = last.metrics
    assert (acc.state, acc.value, acc.best, acc.count) == (monitor_pb2.METRIC_STATE_FOUND, 0.6, 0.7, 3)
    assert acc.direction == monitor_pb2.METRIC_DIRECTION_MAXIMIZE
    assert f1.state == monitor_pb2.METRIC_STATE_NOT_FOUND and "eval/f1.jsonl does not exist" in f1.detail


async def test_a_job_that_exits_3_is_failed_with_exit_code_3_and_its_metric_not_found(
    monitor: Stub, tmp_path: Path
) -> None:
    body = """\
    print("loading data", flush=True)
    raise SystemExit(3)
    """
    submitted = await monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(
            local=local(tmp_path, body), request_id="crash-1", options=monitor_pb2.JobOptions(metrics=[LOSS])
        )
    )
    responses = await watch_all(monitor, submitted.job)
    last = responses[-1].status
    assert last.state == monitor_pb2.JOB_STATE_FAILED and last.exit_code == 3
    [loss] = last.metrics
    assert loss.state == monitor_pb2.METRIC_STATE_NOT_FOUND and loss.count == 0
    assert "no line of the log (1 read) matched" in loss.detail
    assert "loading data" in log_lines(responses)


async def test_the_environment_is_given_and_the_monitors_settings_are_not(monitor: Stub, tmp_path: Path) -> None:
    body = """\
    print("seed", os.environ["SEED"], flush=True)
    print("quarry settings", sorted(n for n in os.environ if n.startswith("QUARRY_")), flush=True)
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
    options = monitor_pb2.JobOptions(wall_clock_limit={"nanos": 500_000_000})
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


# -- restarts ----------------------------------------------------------------------------------------


async def test_a_restarted_monitor_finds_its_jobs_and_never_starts_one_twice(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    body = """\
    with open("launches.txt", "a") as launches:
        launches.write("launched\\n")
    print("loss=0.3", flush=True)
    wait_for(sys.argv[1])
    print("loss=0.25", flush=True)
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
    (work / "go-ends-meanwhile").touch()
    await asyncio.to_thread(wait_until_ended, ends_meanwhile.job.local.pid)  # while no monitor runs

    async with serving(tmp_path) as after:
        again = await after.SubmitJob(request("running"))
        assert again.job == running.job, "the same job, found in its record"
        assert (work / "launches.txt").read_text() == "launched\n" * 2, "never started twice"
        other = request("running")
        other.local.argv.append("--more")
        error = await expect_error(after.SubmitJob(other), grpc.StatusCode.ALREADY_EXISTS)
        assert error_reason(error) == "REQUEST_ID_REUSED"
        (work / "go-running").touch()
        last = (await watch_all(after, again.job))[-1].status
        assert last.state == monitor_pb2.JOB_STATE_EXITED and "exit status is unknown" in last.detail
        [loss] = last.metrics
        assert (loss.state, loss.value, loss.best, loss.count) == (monitor_pb2.METRIC_STATE_FOUND, 0.25, 0.25, 2)
        by_id = monitor_pb2.JobRef(monitor_job_id=ends_meanwhile.job.monitor_job_id)
        gone = (await watch_all(after, by_id))[-1].status
        assert gone.state == monitor_pb2.JOB_STATE_EXITED and "exit status is unknown" in gone.detail
        assert not gone.HasField("exit_code")
        missing = monitor_pb2.JobRef(monitor_job_id="job-0000000000000000")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await watch_all(after, missing)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND and error_reason(raised.value) == "JOB_NOT_FOUND"
    assert (work / "launches.txt").read_text() == "launched\n" * 2


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
    directory = tmp_path / "monitor" / "jobs"
    directory.mkdir(parents=True)
    (directory / "job-00000000000000aa.json").write_text(to_json(record))
    async with serving(tmp_path) as stub:
        [status] = [r.status for r in await watch_all(stub, monitor_pb2.JobRef(monitor_job_id=record.monitor_job_id))]
        request = monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(argv=["true"]), request_id="interrupted")
        error = await expect_error(stub.SubmitJob(request), grpc.StatusCode.ALREADY_EXISTS)
    assert status.state == monitor_pb2.JOB_STATE_UNKNOWN and "whether it started is unknown" in status.detail
    assert error_reason(error) == "REQUEST_ID_REUSED", "its request_id is taken, not started again"


# -- SSH hosts and Slurm --------------------------------------------------------------------------------


@pytest.fixture
async def remote_monitor(ssh_host: FakeHost, tmp_path: Path) -> AsyncIterator[Stub]:
    (tmp_path / "logs").mkdir()
    async with serving(tmp_path, ssh_host.settings(job_poll_seconds=0.2, job_stop_grace_seconds=1.0)) as stub:
        yield stub


async def test_a_job_on_an_ssh_host_gets_a_free_gpu_its_exit_status_and_its_metrics(
    remote_monitor: Stub, tmp_path: Path
) -> None:
    body = """\
    print("devices", os.environ["CUDA_VISIBLE_DEVICES"], "seed", os.environ["SEED"], flush=True)
    print("loss=0.5", flush=True)
    with open("metrics.jsonl", "w") as out:
        out.write('{"acc": 0.9}\\n')
    raise SystemExit(3)
    """
    # The SSH server runs on this machine, so the "remote" job is a process here too.
    command = monitor_pb2.RemoteCommand(
        host="gpu1", argv=[sys.executable, script(tmp_path, body)], working_directory=str(tmp_path)
    )
    accuracy = monitor_pb2.MetricSpec(
        name="acc",
        direction=monitor_pb2.METRIC_DIRECTION_MAXIMIZE,
        jsonl_file=monitor_pb2.JsonlMetric(path="metrics.jsonl", key="acc"),
    )
    options = monitor_pb2.JobOptions(
        environment={"SEED": "11"}, gpus=monitor_pb2.GpuRequest(count=1), metrics=[LOSS, accuracy]
    )
    submitted = await remote_monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(remote=command, request_id="remote-1", options=options)
    )
    assert list(submitted.gpu_indices) == [1], "nvidia-smi shows GPU 0 in use"
    assert submitted.job.remote.host == "gpu1" and submitted.job.log_path.startswith(str(tmp_path / "logs"))
    responses = await watch_all(remote_monitor, submitted.job)
    last = responses[-1].status
    assert last.state == monitor_pb2.JOB_STATE_FAILED and last.exit_code == 3
    assert [(m.name, m.state, m.value) for m in last.metrics] == [
        ("loss", monitor_pb2.METRIC_STATE_FOUND, 0.5),
        ("acc", monitor_pb2.METRIC_STATE_FOUND, 0.9),
    ]
    assert "devices 1 seed 11" in log_lines(responses)


async def test_a_job_on_an_ssh_host_past_its_limit_is_stopped(remote_monitor: Stub, tmp_path: Path) -> None:
    command = monitor_pb2.RemoteCommand(host="gpu1", command_line="sleep 60")
    options = monitor_pb2.JobOptions(wall_clock_limit={"seconds": 1})
    submitted = await remote_monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(remote=command, request_id="remote-sleep", options=options)
    )
    last = (await watch_all(remote_monitor, submitted.job))[-1].status
    assert last.state == monitor_pb2.JOB_STATE_TIMED_OUT, last.detail
    assert live_members(submitted.job.remote.pid) == []


async def test_a_slurm_job_asks_for_its_gpus_time_and_environment(
    ssh_host: FakeHost, remote_monitor: Stub, tmp_path: Path
) -> None:
    sbatch = tmp_path / "fakebin" / "sbatch"
    sbatch.write_text('#!/bin/sh\necho "$@" > "$FAKE_STATE/sbatch.args"; echo "$SEED" > "$FAKE_STATE/seed"; echo 77\n')
    submission = monitor_pb2.SlurmSubmission(host="gpu1", script_path="train.sh", sbatch_args=["--partition=gpu"])
    options = monitor_pb2.JobOptions(
        gpus=monitor_pb2.GpuRequest(count=2), wall_clock_limit={"seconds": 5400}, environment={"SEED": "3"}
    )
    submitted = await remote_monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(slurm=submission, request_id="slurm-1", options=options)
    )
    assert submitted.job.slurm.job_id == "77" and submitted.job.monitor_job_id
    args = (ssh_host.state / "sbatch.args").read_text().split()
    output = f"--output={tmp_path / 'logs' / submitted.job.monitor_job_id}.log"
    assert args == ["--parsable", "--partition=gpu", "--gres=gpu:2", "--time=0-01:30:00", output, "train.sh"]
    assert (ssh_host.state / "seed").read_text() == "3\n"
    outside_workspace = monitor_pb2.MetricSpec(
        name="acc",
        direction=monitor_pb2.METRIC_DIRECTION_MAXIMIZE,
        jsonl_file=monitor_pb2.JsonlMetric(path="metrics.jsonl", key="acc"),
    )
    for field, bad in (
        ("options.gpus.indices", monitor_pb2.JobOptions(gpus=monitor_pb2.GpuRequest(indices=[0]))),
        # Without a workspace, nothing says where it starts: a file metric has no directory to be read in.
        ("options.metrics[0].jsonl_file.path", monitor_pb2.JobOptions(metrics=[outside_workspace])),
    ):
        request = monitor_pb2.SubmitJobRequest(slurm=submission, request_id="slurm-2", options=bad)
        error = await expect_error(remote_monitor.SubmitJob(request), grpc.StatusCode.INVALID_ARGUMENT)
        assert field in violations(error)


# -- bad requests ------------------------------------------------------------------------------------


def _options(**fields: Any) -> monitor_pb2.JobOptions:
    return monitor_pb2.JobOptions(**fields)


def _metric(**fields: Any) -> monitor_pb2.JobOptions:
    spec: dict[str, Any] = {"name": "loss", "direction": monitor_pb2.METRIC_DIRECTION_MINIMIZE}
    spec.update(fields)
    return _options(metrics=[monitor_pb2.MetricSpec(**spec)])


BAD: list[tuple[str, dict[str, Any], monitor_pb2.JobOptions, str]] = [
    ("an unclosed quote", {"command_line": "echo 'oops"}, _options(), "local.command_line"),
    ("argv and a command line", {"argv": ["true"], "command_line": "true"}, _options(), "local.command_line"),
    ("a pattern that is not one", {}, _metric(log_regex="loss=(["), "options.metrics[0].log_regex"),
    ("a pattern without a group", {}, _metric(log_regex="loss=[0-9.]+"), "options.metrics[0].log_regex"),
    ("a pattern with two groups", {}, _metric(log_regex="(a)=(b)"), "options.metrics[0].log_regex"),
    ("a backtracking pattern", {}, _metric(log_regex="(a+)\\1"), "options.metrics[0].log_regex"),
    ("no direction", {}, _metric(direction=0, log_regex="l=(.*)"), "options.metrics[0].direction"),
    ("no source", {}, _metric(), "options.metrics[0].log_regex"),
    ("a bad name", {}, _metric(name="a b", log_regex="l=(.*)"), "options.metrics[0].name"),
    (
        "a file outside",
        {},
        _metric(jsonl_file=monitor_pb2.JsonlMetric(path="../m.jsonl", key="k")),
        "options.metrics[0].jsonl_file.path",
    ),
    (
        "a file without a working directory",
        {"working_directory": ""},
        _metric(jsonl_file=monitor_pb2.JsonlMetric(path="m.jsonl", key="k")),
        "options.metrics[0].jsonl_file.path",
    ),
    ("a bad variable name", {}, _options(environment={"A-B": "1"}), "options.environment"),
    ("a NUL in a value", {}, _options(environment={"A": "1\x00"}), "options.environment"),
    ("no time at all", {}, _options(wall_clock_limit={"seconds": 0}), "options.wall_clock_limit"),
    (
        "a count and indices",
        {},
        _options(gpus=monitor_pb2.GpuRequest(count=1, indices=[0])),
        "options.gpus.indices",
    ),
    (
        "CUDA_VISIBLE_DEVICES with a GPU request",
        {},
        _options(gpus=monitor_pb2.GpuRequest(count=1), environment={"CUDA_VISIBLE_DEVICES": "0"}),
        "options.environment",
    ),
    ("a workspace id that is not one", {}, _options(workspace_id="ws-1"), "options.workspace_id"),
]


@pytest.mark.parametrize(("case", "command", "options", "field"), BAD, ids=[case[0] for case in BAD])
async def test_a_bad_experiment_request_names_its_field_and_starts_nothing(
    monitor: Stub, tmp_path: Path, case: str, command: dict[str, Any], options: monitor_pb2.JobOptions, field: str
) -> None:
    fields: dict[str, Any] = {"argv": ["touch", str(tmp_path / "started")], "working_directory": str(tmp_path)}
    fields.update(command)
    if "command_line" in command and "argv" not in command:
        del fields["argv"]
    request = monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(**fields), request_id="bad", options=options)
    error = await expect_error(monitor.SubmitJob(request), grpc.StatusCode.INVALID_ARGUMENT)
    assert field in violations(error), violations(error)
    assert not (tmp_path / "started").exists()
