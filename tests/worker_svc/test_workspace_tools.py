"""The workspace tools' own refusals, before they ask the monitor (which, here, is never reached)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from quarry.agent.tools import ToolError
from quarry.clients.channels import insecure_channel
from quarry.clients.monitor import MonitorClient
from quarry.compute import ComputeView
from quarry.workspace import WorkspaceView
from worker_svc.tools import JobStatusParams, job_status
from worker_svc.workspace_tools import (
    LaunchParams,
    MetricParams,
    ReadFileParams,
    WorkspaceSession,
    launch_experiment,
    read_file,
)


@dataclass
class Context:
    workspace: WorkspaceSession | None
    monitor: ComputeView | None = None


@pytest.fixture
async def session() -> AsyncIterator[WorkspaceSession]:
    async with insecure_channel("127.0.0.1:9") as channel:  # nothing listens: a call would fail, not hang
        client = MonitorClient(channel)
        yield WorkspaceSession(WorkspaceView(client, "ws-0123456789abcdef"), ComputeView(client), 10.0)


async def test_a_context_without_a_workspace_has_no_workspace_tools_to_use() -> None:
    with pytest.raises(ToolError, match="this task has no workspace"):
        await read_file(ReadFileParams(path="train.py"), Context(workspace=None))


async def test_a_metric_names_one_source(session: WorkspaceSession) -> None:
    for metric in (
        MetricParams(name="loss", direction="minimize"),
        MetricParams(name="loss", direction="minimize", log_regex="loss=(.*)", jsonl_file="m.jsonl", jsonl_key="l"),
    ):
        params = LaunchParams(command="python3 train.py", wall_clock_limit_seconds=60, metrics=[metric])
        with pytest.raises(ToolError, match=r"metrics\[0\]: give either log_regex, or jsonl_file and jsonl_key"):
            await launch_experiment(params, Context(session))
    assert session.jobs == []


async def test_job_status_needs_a_job_and_waits_only_for_the_monitors_own(session: WorkspaceSession) -> None:
    context = Context(session, monitor=session.compute)
    with pytest.raises(ToolError, match="name the job"):
        await job_status(JobStatusParams(), context)  # type: ignore[arg-type]
    with pytest.raises(ToolError, match="wait_seconds is for a job the monitor started"):
        await job_status(JobStatusParams(kind="local", pid=1, wait_seconds=5), context)  # type: ignore[arg-type]
