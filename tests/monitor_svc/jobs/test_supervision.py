"""The supervision every job gets (monitor_svc/jobs/supervision.py): log metrics as they appear, file
metrics once the job has ended, its end recorded; and an executor for every kind of job.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from monitor_svc.jobs import JobKind, SlurmLimits
from monitor_svc.jobs.registry import executors
from monitor_svc.jobs.sandbox import Sandbox
from monitor_svc.logs import Logs
from monitor_svc.ssh import SshHosts
from monitor_svc.workspaces.operations import Workspaces
from monitor_svc.workspaces.registry import WorkspaceRegistry
from quarry.v1 import monitor_pb2
from tests.monitor_svc.jobs.helpers import LOSS, Stub, local, log_lines, points, script, watch_all


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


def test_every_kind_of_job_has_its_executor(tmp_path: Path) -> None:
    hosts = SshHosts({})
    workspaces = Workspaces(WorkspaceRegistry(tmp_path / "workspaces"), hosts, [], git_timeout=1.0)
    sandbox = Sandbox("none", True, [])
    found = executors(hosts, Logs(hosts, [str(tmp_path)]), workspaces, tmp_path, SlurmLimits(), sandbox)
    assert set(found) == set(JobKind) and all(executor.kind is kind for kind, executor in found.items())
    # The monitor stops jobs at their wall-clock limit itself, except where their scheduler does.
    assert [kind for kind, executor in found.items() if executor.groups is None] == [JobKind.SLURM]
