"""The lab port: the campaign's workspace and its jobs, as the loop uses them.

quarry.workspace.WorkspaceView is the real lab (over the monitor); tests give the loop an in-memory
one. Every failure comes as a QuarryError (a MonitorError from the real lab), never a gRPC error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from quarry.client import MonitorClient
from quarry.compute import JobReport
from quarry.vocabulary import JobRef
from quarry.workspace import Experiment, GitState, Launched, WorkspaceView, Written


class Lab(Protocol):
    workspace_id: str

    async def git(self) -> GitState: ...

    async def branch(self, name: str, *, request_id: str) -> GitState: ...

    async def commit(self, message: str, *, request_id: str) -> str: ...

    async def reset(self, commit: str, *, remove_untracked: bool = False) -> GitState: ...

    async def write(self, path: str, content: str) -> Written: ...

    async def launch(self, experiment: Experiment, *, request_id: str = "") -> Launched: ...

    def watch(self, job: JobRef, *, deadline_seconds: float, poll_seconds: int = 2) -> AsyncIterator[JobReport]: ...


class LabOpener(Protocol):
    async def __call__(
        self, root: str, *, host: str, protected_paths: Sequence[str], request_id: str
    ) -> tuple[Lab, GitState]:
        """The workspace under `root` on `host` (opened once per request_id), and its git state."""
        ...


def monitor_lab(client: MonitorClient) -> LabOpener:
    """Labs on the monitor's workspaces."""

    async def open_lab(
        root: str, *, host: str, protected_paths: Sequence[str], request_id: str
    ) -> tuple[Lab, GitState]:
        return await WorkspaceView.open(client, root, host=host, protected_paths=protected_paths, request_id=request_id)

    return open_lab
