"""Bad bytes in monitor requests: INVALID_ARGUMENT naming the field, never INTERNAL, and nothing started."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from monitor_svc.service import build_host
from quarry.clients.channels import insecure_channel
from quarry.config import MonitorSettings, QuarrySettings
from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.rpc import expect_error, violations

Stub = monitor_pb2_grpc.MonitorServiceStub


@pytest.fixture
async def monitor(tmp_path: Path) -> AsyncIterator[Stub]:
    host = await build_host(
        MonitorSettings(address="127.0.0.1:0", allow_job_submission=True), QuarrySettings(data_dir=tmp_path)
    )
    await host.start()
    try:
        async with insecure_channel(host.address) as channel:
            yield monitor_pb2_grpc.MonitorServiceStub(channel)
    finally:
        await host.shutdown()


def local(tmp_path: Path, request_id: str = "bad-1", **fields: Any) -> monitor_pb2.SubmitJobRequest:
    command: dict[str, Any] = {"argv": ["true"], "working_directory": str(tmp_path)}
    command.update(fields)
    return monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(**command), request_id=request_id)


def slurm(**fields: Any) -> monitor_pb2.SubmitJobRequest:
    submission: dict[str, Any] = {"host": "gpu1", "script_path": "/home/q/train.sh"}
    submission.update(fields)
    return monitor_pb2.SubmitJobRequest(slurm=monitor_pb2.SlurmSubmission(**submission), request_id="bad-1")


SUBMISSIONS: list[tuple[str, Any, str]] = [
    ("NUL in the program", lambda tmp: local(tmp, argv=["tr\x00ue"]), "local.argv[0]"),
    ("NUL in an argument", lambda tmp: local(tmp, argv=["echo", "a\x00b"]), "local.argv[1]"),
    (
        "NUL in the working directory",
        lambda tmp: local(tmp, working_directory=f"{tmp}\x00/x"),
        "local.working_directory",
    ),
    ("NUL in the log path", lambda tmp: local(tmp, log_path=f"{tmp}/jobs/a\x00.log"), "local.log_path"),
    ("NUL in the request id", lambda tmp: local(tmp, request_id="r\x00"), "request_id"),
    ("NUL in the script path", lambda tmp: slurm(script_path="/home/q/t\x00.sh"), "slurm.script_path"),
    ("NUL in an sbatch argument", lambda tmp: slurm(sbatch_args=["--gres=gpu:1", "-J\x00x"]), "slurm.sbatch_args[1]"),
    ("NUL in the host", lambda tmp: slurm(host="gpu\x001"), "slurm.host"),
]


@pytest.mark.parametrize(("case", "build", "field"), SUBMISSIONS, ids=[case[0] for case in SUBMISSIONS])
async def test_a_submission_with_a_nul_names_its_field(
    monitor: Stub, tmp_path: Path, case: str, build: Any, field: str
) -> None:
    error = await expect_error(monitor.SubmitJob(build(tmp_path)), grpc.StatusCode.INVALID_ARGUMENT)
    assert field in violations(error), violations(error)
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir()), "nothing was started"


WATCHES = [
    (monitor_pb2.JobRef(local=monitor_pb2.LocalProcess(pid=os.getpid()), log_path="/tmp/a\x00b"), "job.log_path"),
    (monitor_pb2.JobRef(remote=monitor_pb2.RemoteProcess(host="gpu\x00", pid=1)), "job.remote.host"),
    (monitor_pb2.JobRef(slurm=monitor_pb2.SlurmJob(host="g\x00", job_id="1")), "job.slurm.host"),
]


@pytest.mark.parametrize(("job", "field"), WATCHES, ids=[field for _, field in WATCHES])
async def test_a_watch_with_a_nul_names_its_field(monitor: Stub, job: monitor_pb2.JobRef, field: str) -> None:
    request = monitor_pb2.WatchJobRequest(job=job, poll_interval={"seconds": 1})
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in monitor.WatchJob(request, timeout=30):
            raise AssertionError("no status for a malformed job")
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert field in violations(raised.value)


WS = "ws-0123456789abcdef"  # well formed; the checks come before the lookup
WORKSPACE_CALLS: list[tuple[str, str, Any, str]] = [
    ("OpenWorkspace", "root", monitor_pb2.OpenWorkspaceRequest(root="/tmp/a\x00b"), "root"),
    ("OpenWorkspace", "host", monitor_pb2.OpenWorkspaceRequest(host="g\x00", root="/tmp"), "host"),
    (
        "OpenWorkspace",
        "protected path",
        monitor_pb2.OpenWorkspaceRequest(root="/tmp", protected_paths=["ok", "e\x00val"]),
        "protected_paths[1]",
    ),
    ("OpenWorkspace", "request id", monitor_pb2.OpenWorkspaceRequest(root="/tmp", request_id="r\x00"), "request_id"),
    ("ReadWorkspaceFile", "path", monitor_pb2.ReadWorkspaceFileRequest(workspace_id=WS, path="a\x00"), "path"),
    (
        "WriteWorkspaceFile",
        "path",
        monitor_pb2.WriteWorkspaceFileRequest(workspace_id=WS, path="a\x00", content="x"),
        "path",
    ),
    (
        "SearchWorkspace",
        "glob",
        monitor_pb2.SearchWorkspaceRequest(workspace_id=WS, pattern="x", glob="*\x00"),
        "glob",
    ),
    (
        "PatchWorkspace",
        "path in the patch",
        monitor_pb2.PatchWorkspaceRequest(workspace_id=WS, patch="--- a/x\x00\n+++ b/x\x00\n@@ -1 +1 @@\n-a\n+b\n"),
        "patch",
    ),
    (
        "CreateWorkspaceBranch",
        "branch",
        monitor_pb2.CreateWorkspaceBranchRequest(workspace_id=WS, branch="b\x00"),
        "branch",
    ),
    ("CommitWorkspace", "message", monitor_pb2.CommitWorkspaceRequest(workspace_id=WS, message="m\x00"), "message"),
    ("ResetWorkspace", "commit", monitor_pb2.ResetWorkspaceRequest(workspace_id=WS, commit="HEAD\x00"), "commit"),
    ("GetWorkspace", "workspace id", monitor_pb2.GetWorkspaceRequest(workspace_id="ws-\x00"), "workspace_id"),
]


@pytest.mark.parametrize(
    ("method", "case", "request_message", "field"),
    WORKSPACE_CALLS,
    ids=[f"{method}: {case}" for method, case, _, _ in WORKSPACE_CALLS],
)
async def test_a_workspace_request_with_a_nul_names_its_field(
    monitor: Stub, method: str, case: str, request_message: Any, field: str
) -> None:
    error = await expect_error(getattr(monitor, method)(request_message), grpc.StatusCode.INVALID_ARGUMENT)
    assert field in violations(error), violations(error)
