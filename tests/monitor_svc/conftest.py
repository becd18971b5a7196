"""Fixtures of the monitor's tests: the loopback SSH server (tests/monitor_svc/fake_ssh.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.monitor_svc.fake_ssh import FakeHost, fake_ssh_host


@pytest.fixture
async def ssh_host(tmp_path: Path) -> AsyncIterator[FakeHost]:
    async with fake_ssh_host(tmp_path) as fake:
        yield fake
