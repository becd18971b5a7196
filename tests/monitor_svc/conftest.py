"""Fixtures of the monitor's tests: the loopback SSH server (tests/monitor_svc/fake_ssh.py), a monitor with it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quarry.v1 import monitor_pb2_grpc
from tests.monitor_svc.fake_ssh import FakeHost, fake_ssh_host, monitor_for


@pytest.fixture
async def ssh_host(tmp_path: Path) -> AsyncIterator[FakeHost]:
    async with fake_ssh_host(tmp_path) as fake:
        yield fake


@pytest.fixture
async def ssh_monitor(ssh_host: FakeHost, tmp_path: Path) -> AsyncIterator[monitor_pb2_grpc.MonitorServiceStub]:
    """A monitor with the SSH host gpu1, whose Slurm gives a job up after 3 polls."""
    host, channel, stub = await monitor_for(ssh_host.settings(slurm_unknown_polls=3), tmp_path)
    yield stub
    await channel.close(None)
    await host.shutdown()
