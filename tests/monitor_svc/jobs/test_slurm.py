"""Slurm jobs (monitor_svc/jobs/slurm.py): sacct, squeue and sbatch output read strictly, and jobs submitted
and followed through a real SSH connection to fake Slurm commands.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from monitor_svc.jobs.slurm import parse_sacct, parse_sbatch, parse_squeue, parse_time_limit
from monitor_svc.smi import MalformedOutput
from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from quarry.vocabulary import JobState
from tests.monitor_svc.fake_ssh import FakeHost
from tests.monitor_svc.jobs.helpers import Stub, watch_all
from tests.rpc import expect_error, violations

# -- sacct, squeue and sbatch output ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "state", "exit_code"),
    [
        ("42|COMPLETED|0:0|01:00:00", JobState.COMPLETED, 0),
        ("42|COMPLETED|1:0|01:00:00", JobState.FAILED, 1),  # a non-zero exit is never "completed"
        ("42|FAILED|3:0|01:00:00", JobState.FAILED, 3),
        ("42|OUT_OF_MEMORY|0:125|01:00:00", JobState.FAILED, 253),
        ("42|TIMEOUT|0:0|00:10:00", JobState.TIMED_OUT, None),
        ("42|CANCELLED by 1000|0:15|UNLIMITED", JobState.CANCELLED, 143),
        ("42|CANCELLED+|0:0|UNLIMITED", JobState.CANCELLED, None),
        ("42|RUNNING|0:0|1-00:00:00", JobState.RUNNING, None),
        ("42|PENDING|0:0|30", JobState.PENDING, None),
    ],
)
def test_sacct_states_and_exit_codes(line: str, state: JobState, exit_code: int | None) -> None:
    found = parse_sacct(f"{line}\n42.batch|RUNNING|0:0|\n", "42")
    assert found is not None and (found.state, found.exit_code) == (state, exit_code)


def test_sacct_reads_the_job_line_and_its_time_limit() -> None:
    found = parse_sacct("42.batch|FAILED|9:0|\n42|RUNNING|0:0|1-02:03:04\n", "42")
    assert found is not None and found.state is JobState.RUNNING
    assert found.time_limit_seconds == parse_time_limit("1-02:03:04") == 93784.0
    assert parse_sacct("", "42") is None and parse_sacct("43|RUNNING|0:0|\n", "42") is None
    for bad in ("42|RUNNING|0:0", "42|EXPLODED|0:0|", "42|FAILED|x:0|"):
        with pytest.raises(MalformedOutput):
            parse_sacct(bad, "42")


def test_squeue_and_sbatch() -> None:
    assert parse_squeue("") is None
    single = parse_squeue("PENDING\n")
    assert single is not None and single.state is JobState.PENDING
    array = parse_squeue("PENDING\nRUNNING\nPENDING\n")  # an array job: one line per task
    assert array is not None and array.state is JobState.RUNNING
    assert parse_sbatch("4242;cluster\n") == "4242" and parse_sbatch("17\n") == "17"
    with pytest.raises(MalformedOutput):
        parse_sbatch("Submitted batch job 17\n")


# -- jobs ------------------------------------------------------------------------------------------


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


async def test_a_slurm_job_is_submitted_and_followed_to_its_failure(
    ssh_host: FakeHost, ssh_monitor: monitor_pb2_grpc.MonitorServiceStub
) -> None:
    submission = monitor_pb2.SubmitJobRequest(
        slurm=monitor_pb2.SlurmSubmission(host="gpu1", script_path="train.sh", sbatch_args=["--time=01:00:00"]),
        request_id="train-1",
    )
    submitted = await ssh_monitor.SubmitJob(submission)
    again = await ssh_monitor.SubmitJob(submission)  # a retry: the same job, not a second sbatch
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
    responses = await watch_all(ssh_monitor, monitor_pb2.JobRef(slurm=submitted.job.slurm))
    await changer
    states = [r.status.state for r in responses]
    assert states[0] == monitor_pb2.JOB_STATE_PENDING and "squeue" in responses[0].status.detail
    assert monitor_pb2.JOB_STATE_RUNNING in states
    last = responses[-1].status
    assert last.state == monitor_pb2.JOB_STATE_FAILED and last.exit_code == 3
    assert len(states) == len(set(states)), "a response only when something changed"


async def test_a_job_slurm_never_knew_is_given_up(ssh_monitor: monitor_pb2_grpc.MonitorServiceStub) -> None:
    job = monitor_pb2.JobRef(slurm=monitor_pb2.SlurmJob(host="gpu1", job_id="777"))
    responses = await watch_all(ssh_monitor, job)
    assert responses[-1].status.state == monitor_pb2.JOB_STATE_UNKNOWN
    assert "after 3 polls" in responses[-1].status.detail


async def test_malformed_sacct_output_is_a_clear_error(
    ssh_host: FakeHost, ssh_monitor: monitor_pb2_grpc.MonitorServiceStub
) -> None:
    ssh_host.write("sacct.txt", "4242|EXPLODED|0:0|01:00:00\n")
    job = monitor_pb2.JobRef(slurm=monitor_pb2.SlurmJob(host="gpu1", job_id="4242"))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await watch_all(ssh_monitor, job)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "unknown Slurm state 'EXPLODED'" in (raised.value.details() or "")
