"""A job's output as hostile input: metrics lines that break parsers, a log that would fill the disk
(monitor_svc/metrics.py, monitor_svc/log_relay.py, monitor_svc/jobs/local.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor_svc import log_relay
from monitor_svc.jobs import LogLimits
from monitor_svc.log_relay import STATE_BYTES, STATE_SUFFIX, RelayState, parse_state
from monitor_svc.logs import LogCursor, Logs
from monitor_svc.ssh import SshHosts
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


# -- reading a log that was cut ------------------------------------------------------------------------


def numbered(first: int, count: int) -> bytes:
    return b"".join(b"line %05d of the output\n" % number for number in range(first, first + count))


def written(log: Path, ending: bytes, *, cut_over: int = -1) -> RelayState:
    """Wait until the relay has written `ending` having cut more than `cut_over` bytes in all: bounded, never a
    fixed sleep."""
    for _ in range(1200):
        state = parse_state(log.with_name(log.name + STATE_SUFFIX).read_bytes())
        if log.read_bytes().endswith(ending[-100:]) and state is not None and state.cut > cut_over:
            return state
        time.sleep(0.05)
    raise AssertionError("the relay did not write the output")


async def test_a_reader_of_a_log_that_was_cut_goes_on_in_its_tail_without_reading_a_line_twice(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    descriptors = [os.open(log, os.O_RDWR | os.O_CREAT), os.open(f"{log}{STATE_SUFFIX}", os.O_RDWR | os.O_CREAT)]
    os.pwrite(descriptors[1], b" " * STATE_BYTES, 0)
    read_end, write_end = os.pipe()
    relay = await asyncio.create_subprocess_exec(
        *(sys.executable, "-I", log_relay.__file__, "--max-bytes", str(64 * 1024), "--reserve-bytes", "0"),
        *("--log-fd", str(descriptors[0]), "--state-fd", str(descriptors[1]), "--pgid", str(2**22 + 12345)),
        stdin=read_end,
        pass_fds=descriptors,
    )
    for descriptor in (read_end, *descriptors):
        os.close(descriptor)
    try:
        logs = Logs(SshHosts({}), [str(tmp_path)])
        cursor = LogCursor(str(log))
        first = numbered(0, 2400)  # 60000 bytes: under the cap of 64 KiB
        os.write(write_end, first)
        await asyncio.to_thread(written, log, first)
        assert await logs.lines(cursor, 0, final=False) == first.decode().splitlines()
        second = numbered(2400, 400)  # past the cap: the middle is cut, this in the kept tail
        os.write(write_end, second)
        cut = await asyncio.to_thread(functools.partial(written, log, second, cut_over=0))
        assert await logs.lines(cursor, 0, final=False) == second.decode().splitlines()
        fresh = LogCursor(str(log))  # reads the head, the marker, then into the tail
        read = await logs.lines(fresh, 0, final=False)
        assert read[0] == "line 00000 of the output" and "bytes of this job's output were cut here" in read[656]
        assert read[-400:] == second.decode().splitlines()
        third = numbered(2800, 1400)  # cut again: its first part is gone before anyone read it
        os.write(write_end, third)
        state = await asyncio.to_thread(functools.partial(written, log, third, cut_over=cut.cut))
        kept = (await asyncio.to_thread(log.read_bytes))[state.tail_at :].decode().splitlines()
        assert third.decode().splitlines()[-len(kept) :] == kept
        assert await logs.lines(cursor, 0, final=False) == kept
        assert await logs.lines(fresh, 0, final=False) == kept
    finally:
        os.close(write_end)
        await asyncio.wait_for(relay.wait(), 60)
    assert relay.returncode == 0
    assert (await asyncio.to_thread(log.stat)).st_size <= 64 * 1024
