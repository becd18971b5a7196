"""What the job tests share: a monitor over real gRPC, tiny Python scripts as jobs, and watching them to their end.

A script that must still be running when a test acts waits for a file the test creates (never for a
time), bounded so that a failing test cannot leave it behind.
"""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from monitor_svc.service import build_host
from quarry.clients.channels import insecure_channel
from quarry.config import MonitorSettings, QuarrySettings
from quarry.v1 import monitor_pb2, monitor_pb2_grpc

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
async def serving(directory: Path, monitor_settings: MonitorSettings | None = None) -> AsyncIterator[Stub]:
    """A monitor whose data directory is directory/data: hidden from sandboxed jobs, which run in `directory`."""
    common = QuarrySettings(data_dir=directory / "data", shutdown_grace_seconds=1)
    # Some tests end while a job is still followed: its supervision stops within a 1 s grace, not the default 5 s.
    host = await build_host(monitor_settings or settings(), common)
    async with host, insecure_channel(host.address) as channel:
        yield monitor_pb2_grpc.MonitorServiceStub(channel)


def script(directory: Path, body: str, name: str = "job.py") -> str:
    path = directory / name
    path.write_text(WAIT_FOR + textwrap.dedent(body))
    return str(path)


def local(directory: Path, body: str, **fields: Any) -> monitor_pb2.LocalCommand:
    return monitor_pb2.LocalCommand(
        argv=[sys.executable, script(directory, body)], working_directory=str(directory), **fields
    )


async def watch_all(stub: Stub, job: monitor_pb2.JobRef, **kwargs: Any) -> list[monitor_pb2.WatchJobResponse]:
    request = monitor_pb2.WatchJobRequest(job=job, poll_interval={"seconds": 1}, **kwargs)
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
