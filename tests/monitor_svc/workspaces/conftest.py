"""The workspace tests' monitor, each test on this machine and over SSH, and its workspace."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quarry.config import MonitorSettings
from tests.monitor_svc.fake_ssh import fake_ssh_host
from tests.monitor_svc.workspaces.helpers import Env, make_repo


@pytest.fixture(params=["local", "ssh"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    roots = tmp_path / "roots"
    project = roots / "project"
    project.mkdir(parents=True)
    make_repo(project)
    async with contextlib.AsyncExitStack() as stack:
        if request.param == "ssh":
            fake = await stack.enter_async_context(fake_ssh_host(tmp_path))
            settings, host = fake.settings(workspace_roots=[str(roots)]), "gpu1"
        else:
            settings, host = MonitorSettings(address="127.0.0.1:0", workspace_roots=[str(roots)]), ""
        environment = Env(host, roots, project, tmp_path, settings, stack)
        await environment.start()
        yield environment


@pytest.fixture
async def ws(env: Env) -> str:
    return (await env.open()).workspace_id
