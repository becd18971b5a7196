"""A job's output as hostile input: metrics lines that break parsers, a log that would fill the disk
(monitor_svc/metrics.py, monitor_svc/log_relay.py, monitor_svc/jobs/local.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor_svc.jobs import LogLimits
from monitor_svc.log_relay import STATE_SUFFIX
from quarry.config import MonitorSettings
from quarry.v1 import monitor_pb2
from tests.monitor_svc.jobs.helpers import LOSS, Stub, local, log_lines, serving, settings, watch_all

MIB = 1 << 20


async def test_a_metrics_file_with_hostile_lines_is_read_around_them_and_the_job_succeeds(
    monitor: Stub, tmp_path: Path
) -> None:
    body = """\
    lines = [
        '{"acc": 0.5}',
        "[" * 60000,  # short enough to be parsed: the parser would recurse past Python's limit
        "[" * 100000,
        '{"acc": ' + "[" * 70 + "]" * 70 + "}",
        '{"acc": NaN}',
        '{"acc": Infinity}',
        '{"acc": -Infinity}',
        '{"acc": 1e999}',
        '{"acc": ' + "9" * 5000 + "}",  # past Python's int string conversion limit
        '{"acc": 0.7, "note": "' + "[" * 100 + '"}',  # brackets in a string are no nesting
        '{"acc": 0.6}',
    ]
    with open("metrics.jsonl", "w") as out:
        out.write("\\n".join(lines) + "\\n")
    print("loss=" + "9" * 5000, flush=True)  # too large for a float: a match that is not a number
    print("loss=0.25", flush=True)
    """
    accuracy = monitor_pb2.MetricSpec(
        name="acc",
        direction=monitor_pb2.METRIC_DIRECTION_MAXIMIZE,
        jsonl_file=monitor_pb2.JsonlMetric(path="metrics.jsonl", key="acc"),
    )
    options = monitor_pb2.JobOptions(metrics=[accuracy, LOSS])
    submitted = await monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(local=local(tmp_path, body), request_id="hostile-jsonl", options=options)
    )
    last = (await watch_all(monitor, submitted.job))[-1].status
    assert (last.state, last.exit_code) == (monitor_pb2.JOB_STATE_COMPLETED, 0), last.detail
    acc, loss = last.metrics
    assert (acc.state, acc.value, acc.best, acc.count) == (monitor_pb2.METRIC_STATE_FOUND, 0.6, 0.7, 3)
    assert (loss.value, loss.count) == (0.25, 1) and "1 match(es) were not numbers" in loss.detail


# -- the log cap -------------------------------------------------------------------------------------

WRITE_2_GIB = """\
out = sys.stdout.buffer
out.write(b"loss=0.5\\n")
block = b"a" * (1 << 20)
for _ in range(2048):
    out.write(block)
out.write(b"\\nloss=0.25\\n")
"""


async def test_a_job_writing_2_gib_keeps_its_log_under_the_cap_with_its_head_a_marker_and_its_tail(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, settings(max_job_log_bytes=MIB)) as stub:
        submitted = await stub.SubmitJob(
            monitor_pb2.SubmitJobRequest(
                local=local(tmp_path, WRITE_2_GIB),
                request_id="big-log",
                options=monitor_pb2.JobOptions(metrics=[LOSS]),
            )
        )
        responses = await watch_all(stub, submitted.job)
    last = responses[-1].status
    assert (last.state, last.exit_code) == (monitor_pb2.JOB_STATE_COMPLETED, 0), last.detail
    log = await asyncio.to_thread(Path(submitted.job.log_path).read_bytes)
    assert len(log) <= MIB
    assert log.startswith(b"loss=0.5\naaaa") and log.endswith(b"aaaa\nloss=0.25\n")
    _, marker, tail = log.partition(b"\n[quarry: ")
    cut = int(tail.split(b" ", 1)[0])
    assert marker and 2 * 1024 * MIB - MIB < cut < 2 * 1024 * MIB, "the middle is cut, once said"
    assert b"bytes of this job's output were cut here" in tail
    [loss] = last.metrics
    # The last value is in the tail after the cuts; the reader went on past them without reading twice.
    assert (loss.value, loss.best, loss.count) == (0.25, 0.25, 2)
    assert "loss=0.25" in log_lines(responses)


def test_a_jobs_log_is_capped_at_1_gib_by_default() -> None:
    assert MonitorSettings().max_job_log_bytes == 1 << 30 == LogLimits().max_bytes
    assert MonitorSettings().job_log_disk_reserve_bytes == 1 << 30


# -- a full disk ---------------------------------------------------------------------------------------

WRITE_FOREVER = """\
out = sys.stdout.buffer
out.write(b"started\\n")
block = b"b" * (1 << 16)
while True:
    out.write(block)
"""


async def test_a_job_is_stopped_when_the_disk_of_its_log_has_less_free_space_than_the_reserve(tmp_path: Path) -> None:
    reserve = 1 << 62  # more than any disk has free
    async with serving(tmp_path, settings(job_log_disk_reserve_bytes=reserve)) as stub:
        submitted = await stub.SubmitJob(
            monitor_pb2.SubmitJobRequest(local=local(tmp_path, WRITE_FOREVER), request_id="reserve")
        )
        last = (await watch_all(stub, submitted.job))[-1].status
    assert last.state == monitor_pb2.JOB_STATE_FAILED and last.exit_code == 128 + 9
    assert last.detail.startswith("stopped: the disk holding its log is full (")
    assert last.detail.endswith(f" bytes free, reserve {reserve})")
    assert await asyncio.to_thread(os.path.getsize, submitted.job.log_path) == 0, "not a byte written below the reserve"


@contextlib.contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[Path]:
    directory.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], check=False)
    if mounted.returncode != 0:
        pytest.skip("a tmpfs cannot be mounted here (not root, or a container without the capability)")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


async def test_a_job_filling_the_disk_of_its_log_is_stopped_with_the_reason(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "8m") as jobs_dir:
        async with serving(tmp_path, settings(jobs_dir=str(jobs_dir), job_log_disk_reserve_bytes=0)) as stub:
            command = local(tmp_path, WRITE_FOREVER)
            submitted = await stub.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="enospc"))
            last = (await watch_all(stub, submitted.job))[-1].status
        assert last.state == monitor_pb2.JOB_STATE_FAILED and last.exit_code == 128 + 9
        assert last.detail.startswith("stopped: the disk holding its log is full (") and "reserve 0)" in last.detail
        state = await asyncio.to_thread(Path(submitted.job.log_path + STATE_SUFFIX).read_text)
        assert "stopped: the disk holding its log is full" in state, "recorded though the disk is full"
