"""Monitors for the job tests: one that runs jobs here, one with the SSH host gpu1 (and its Slurm)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.monitor_svc.fake_ssh import FakeHost
from tests.monitor_svc.jobs.helpers import Stub, serving


@pytest.fixture
async def monitor(tmp_path: Path) -> AsyncIterator[Stub]:
    async with serving(tmp_path) as stub:
        yield stub


@pytest.fixture
async def remote_monitor(ssh_host: FakeHost, tmp_path: Path) -> AsyncIterator[Stub]:
    (tmp_path / "logs").mkdir()
    async with serving(tmp_path, ssh_host.settings(job_poll_seconds=0.2, job_stop_grace_seconds=1.0)) as stub:
        yield stub
