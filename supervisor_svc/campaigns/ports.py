"""The campaign loop's ports: the lab (the campaign's workspace and its jobs) and the campaign it drives.

quarry.workspace.WorkspaceView is the real lab (over the monitor), and service.CampaignHandle the real
campaign (over the store); tests give the loop in-memory ones (tests/supervisor_svc/campaigns/fakes.py).
Every failure of the lab comes as a QuarryError (a MonitorError from the real one), never a gRPC error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Protocol

from quarry.clients.monitor import MonitorClient
from quarry.compute import JobReport
from quarry.records.campaign import TrialRecord
from quarry.vocabulary import JobRef
from quarry.workspace import Committed, Experiment, GitState, Launched, WorkspaceView, Written
from supervisor_svc.campaigns.events import Event
from supervisor_svc.campaigns.state import CampaignRecord, CampaignState, DirectiveRecord, Phase, Progress


class Lab(Protocol):
    workspace_id: str

    async def git(self) -> GitState: ...

    async def branch(self, name: str, *, request_id: str) -> GitState: ...

    async def commit(self, message: str, *, request_id: str) -> Committed: ...

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


class DrivenCampaign(Protocol):
    """The campaign as the loop that drives it may change it (service.CampaignHandle says what each does)."""

    @property
    def campaign_id(self) -> str: ...

    @property
    def record(self) -> CampaignRecord: ...

    async def current(self) -> CampaignRecord: ...

    async def set_phase(self, phase: Phase, cycle: int, message: str = "") -> None: ...

    async def emit(self, *batch: Event, key: str = "") -> bool: ...

    async def record_usage(self, tokens: int) -> None: ...

    async def record_trial(self, record: TrialRecord, progress: Progress | None = None) -> bool: ...

    async def sleep(self, until: datetime, reason: str) -> None: ...

    async def pending_directives(self) -> list[DirectiveRecord]: ...

    async def consume_directives(self, request_ids: Sequence[str], cycle: int) -> list[DirectiveRecord]: ...

    async def pause(self, reason: str) -> None: ...

    async def finish(self, state: CampaignState, reason: str) -> None: ...


def monitor_lab(client: MonitorClient) -> LabOpener:
    """Labs on the monitor's workspaces."""

    async def open_lab(
        root: str, *, host: str, protected_paths: Sequence[str], request_id: str
    ) -> tuple[Lab, GitState]:
        return await WorkspaceView.open(client, root, host=host, protected_paths=protected_paths, request_id=request_id)

    return open_lab
