"""Jobs in a workspace (JobOptions.workspace_id): they run on the workspace's host, in its root or a directory
inside it, which the workspace path rules check; JSON-lines metrics are read there. Locally, over SSH and through
Slurm (the fake tools of tests/monitor_svc/fake_ssh.py)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from quarry.v1 import monitor_pb2
from tests.monitor_svc.fake_ssh import FakeHost
from tests.monitor_svc.jobs.helpers import Stub, log_lines, serving, settings, watch_all
from tests.rpc import error_reason, expect_error, violations

PLACE = "import json, os\nprint('cwd', os.getcwd(), flush=True)\nopen('m.jsonl', 'w').write(json.dumps({'acc': 0.8}))\n"
ACCURACY = monitor_pb2.MetricSpec(
    name="acc",
    direction=monitor_pb2.METRIC_DIRECTION_MAXIMIZE,
    jsonl_file=monitor_pb2.JsonlMetric(path="m.jsonl", key="acc"),
)


def project(root: Path) -> Path:
    """A workspace directory with a script and a subdirectory, under the workspace root `root`; resolved, as
    the monitor reports it."""
    path = root / "project"
    (path / "sub").mkdir(parents=True)
    (path / "place.py").write_text(PLACE)
    return path.resolve()


async def open_workspace(stub: Stub, path: Path, host: str = "") -> str:
    request = monitor_pb2.OpenWorkspaceRequest(host=host, root=str(path), protected_paths=["data"])
    return (await stub.OpenWorkspace(request)).workspace.workspace_id


def options(workspace_id: str, **fields: Any) -> monitor_pb2.JobOptions:
    return monitor_pb2.JobOptions(workspace_id=workspace_id, **fields)


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[tuple[Stub, Path, str]]:
    path = project(tmp_path / "roots")
    async with serving(tmp_path, settings(workspace_roots=[str(tmp_path / "roots")])) as stub:
        yield stub, path, await open_workspace(stub, path)


async def test_a_job_in_a_local_workspace_runs_in_its_root_or_a_directory_inside(
    local: tuple[Stub, Path, str],
) -> None:
    stub, path, workspace_id = local
    script = str(path / "place.py")
    for working_directory, expected in (("", path), ("sub", path / "sub"), ("./sub/", path / "sub")):
        command = monitor_pb2.LocalCommand(argv=[sys.executable, script], working_directory=working_directory)
        submitted = await stub.SubmitJob(
            monitor_pb2.SubmitJobRequest(
                local=command, request_id=f"in-{working_directory}", options=options(workspace_id, metrics=[ACCURACY])
            )
        )
        responses = await watch_all(stub, submitted.job)
        assert f"cwd {expected}" in log_lines(responses)
        last = responses[-1].status
        assert last.state == monitor_pb2.JOB_STATE_COMPLETED
        [accuracy] = last.metrics
        assert (accuracy.state, accuracy.value) == (monitor_pb2.METRIC_STATE_FOUND, 0.8), "read in the workspace"


async def test_a_working_directory_that_leaves_the_workspace_is_refused_and_nothing_runs(
    local: tuple[Stub, Path, str], tmp_path: Path
) -> None:
    stub, path, workspace_id = local
    outside = tmp_path / "outside"
    outside.mkdir()
    (path / "out").symlink_to(outside)

    def submit(working_directory: str, **fields: Any) -> Any:
        command = monitor_pb2.LocalCommand(argv=["touch", "started"], working_directory=working_directory)
        request = monitor_pb2.SubmitJobRequest(local=command, request_id="escape", options=options(workspace_id))
        request.MergeFrom(monitor_pb2.SubmitJobRequest(**fields))
        return stub.SubmitJob(request)

    for bad in ("../outside", "/tmp", "sub/../../outside"):
        error = await expect_error(submit(bad), grpc.StatusCode.INVALID_ARGUMENT)
        assert "local.working_directory" in violations(error), bad
        assert error_reason(error) == "WORKSPACE_PATH_ESCAPES"
    for bad in ("out", "out/"):
        error = await expect_error(submit(bad), grpc.StatusCode.FAILED_PRECONDITION)
        assert error_reason(error) == "WORKSPACE_PATH_ESCAPES", "a symbolic link leading out"
    error = await expect_error(submit("missing"), grpc.StatusCode.NOT_FOUND)
    assert "local.working_directory" in violations(error)
    error = await expect_error(submit("place.py"), grpc.StatusCode.FAILED_PRECONDITION)
    assert error_reason(error) == "WORKSPACE_WRONG_KIND"
    unknown = submit("", options=options("ws-0123456789abcdef"))
    unknown_error = await expect_error(unknown, grpc.StatusCode.NOT_FOUND)
    assert error_reason(unknown_error) == "WORKSPACE_NOT_FOUND" and "options.workspace_id" in violations(unknown_error)
    remote = monitor_pb2.SubmitJobRequest(
        remote=monitor_pb2.RemoteCommand(argv=["true"]), request_id="remote", options=options(workspace_id)
    )
    error = await expect_error(stub.SubmitJob(remote), grpc.StatusCode.INVALID_ARGUMENT)
    assert "on this machine" in violations(error)["options.workspace_id"]
    assert not list(path.rglob("started")) and not (outside / "started").exists()


async def test_a_job_in_an_ssh_workspace_runs_there_and_slurm_starts_in_its_root(
    ssh_host: FakeHost, tmp_path: Path
) -> None:
    (tmp_path / "logs").mkdir()
    path = project(tmp_path / "roots")
    (path / "train.sh").write_text("#!/bin/sh\n")
    monitor = ssh_host.settings(workspace_roots=[str(tmp_path / "roots")], job_poll_seconds=0.2)
    async with serving(tmp_path, monitor) as stub:
        workspace_id = await open_workspace(stub, path, "gpu1")
        # The host may be left out: the workspace's is used.
        command = monitor_pb2.RemoteCommand(argv=[sys.executable, str(path / "place.py")], working_directory="sub")
        submitted = await stub.SubmitJob(
            monitor_pb2.SubmitJobRequest(
                remote=command, request_id="ssh-1", options=options(workspace_id, metrics=[ACCURACY])
            )
        )
        assert submitted.job.remote.host == "gpu1"
        responses = await watch_all(stub, submitted.job)
        assert f"cwd {path / 'sub'}" in log_lines(responses)
        assert responses[-1].status.metrics[0].value == 0.8

        slurm = monitor_pb2.SlurmSubmission(script_path="train.sh", sbatch_args=["--chdir=/elsewhere"])
        queued = await stub.SubmitJob(
            monitor_pb2.SubmitJobRequest(slurm=slurm, request_id="slurm-1", options=options(workspace_id))
        )
        assert queued.job.slurm.host == "gpu1"
        args = (ssh_host.state / "sbatch.args").read_text().split()
        output = f"--output={queued.job.log_path}"
        assert args == ["--parsable", "--chdir=/elsewhere", f"--chdir={path}", output, f"{path}/train.sh"], "ours wins"

        for request, field in (
            (monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(argv=["true"])), "options.workspace_id"),
            (monitor_pb2.SubmitJobRequest(remote=monitor_pb2.RemoteCommand(host="gpu2", argv=["true"])), "remote.host"),
            (
                monitor_pb2.SubmitJobRequest(slurm=monitor_pb2.SlurmSubmission(script_path="../x.sh")),
                "slurm.script_path",
            ),
        ):
            request.request_id, request.options.workspace_id = "bad", workspace_id
            error = await expect_error(stub.SubmitJob(request), grpc.StatusCode.INVALID_ARGUMENT)
            assert field in violations(error), violations(error)


async def test_a_slurm_job_in_a_workspace_has_its_output_as_its_log_and_its_metrics_read_by_the_monitor(
    ssh_host: FakeHost, tmp_path: Path
) -> None:
    (tmp_path / "logs").mkdir()
    ssh_host.run_batch_jobs()
    path = project(tmp_path / "roots")
    (path / "train.sh").write_text(f"{sys.executable} place.py\necho loss=0.25\n")
    loss = monitor_pb2.MetricSpec(
        name="loss", direction=monitor_pb2.METRIC_DIRECTION_MINIMIZE, log_regex=r"loss=([0-9.]+)"
    )
    monitor = ssh_host.settings(workspace_roots=[str(tmp_path / "roots")], job_poll_seconds=0.2)
    async with serving(tmp_path, monitor) as stub:
        workspace_id = await open_workspace(stub, path, "gpu1")
        submitted = await stub.SubmitJob(
            monitor_pb2.SubmitJobRequest(
                slurm=monitor_pb2.SlurmSubmission(script_path="train.sh"),
                request_id="slurm-metrics",
                options=options(workspace_id, metrics=[loss, ACCURACY]),
            )
        )
        responses = await watch_all(stub, submitted.job)
    [arguments] = ssh_host.batch_submissions()
    assert arguments[-1] == f"{path}/train.sh" and submitted.job.slurm.job_id == "101"
    assert f"cwd {path}" in log_lines(responses), "its output, the log under the host's log root"
    last = responses[-1].status
    assert last.state == monitor_pb2.JOB_STATE_COMPLETED and last.exit_code == 0, last.detail
    assert [(m.name, m.state, m.value) for m in last.metrics] == [
        ("loss", monitor_pb2.METRIC_STATE_FOUND, 0.25),
        ("acc", monitor_pb2.METRIC_STATE_FOUND, 0.8),
    ]


PROTECTED_WRITES = """\
import os
def attempt(path):
    try:
        with open(path, "a") as file:
            file.write("changed\\n")
        print(path, "written", flush=True)
    except OSError as error:
        print(path, "refused", error.strerror, flush=True)
for path in ("evaluate.py", "data/labels.csv", "configs/base.lock", "configs/free.toml", "train.py"):
    attempt(path)
try:
    os.rename("evaluate.py", "moved.py")
    print("rename done", flush=True)
except OSError as error:
    print("rename refused", error.strerror, flush=True)
"""


async def test_a_sandboxed_job_cannot_change_the_workspaces_protected_paths(tmp_path: Path) -> None:
    path = project(tmp_path / "roots")
    for name in ("evaluate.py", "data/labels.csv", "configs/base.lock", "configs/free.toml", "train.py"):
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text("original\n")
    (path / "run.py").write_text(PROTECTED_WRITES)
    async with serving(tmp_path, settings(workspace_roots=[str(tmp_path / "roots")])) as stub:
        opened = await stub.OpenWorkspace(
            monitor_pb2.OpenWorkspaceRequest(root=str(path), protected_paths=["evaluate.py", "data", "configs/*.lock"])
        )
        command = monitor_pb2.LocalCommand(argv=[sys.executable, "run.py"])
        request = monitor_pb2.SubmitJobRequest(
            local=command, request_id="protected", options=options(opened.workspace.workspace_id)
        )
        lines = log_lines(await watch_all(stub, (await stub.SubmitJob(request)).job))
    assert lines == [
        "evaluate.py refused Read-only file system",
        "data/labels.csv refused Read-only file system",
        "configs/base.lock refused Read-only file system",
        "configs/free.toml written",
        "train.py written",
        "rename refused Device or resource busy",
    ]
    for name in ("evaluate.py", "data/labels.csv", "configs/base.lock"):
        assert (path / name).read_text() == "original\n"
    assert (path / "train.py").read_text() == "original\nchanged\n"
