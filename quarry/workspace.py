"""One workspace of the monitor's, in domain terms, over MonitorClient: files, search, edits and jobs.

A view is bound to one workspace_id when it is made; nothing it offers names another, so whoever
holds it (an engineer's tools) reaches that workspace and no other. The monitor enforces the rest:
paths stay inside the root, protected paths are never written, jobs run there. Nothing here calls
a model.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import grpc

from quarry.clients.monitor import MonitorClient
from quarry.compute import MonitorError
from quarry.convert import duration, enum_label, job_ref_from_proto
from quarry.v1 import monitor_pb2
from quarry.vocabulary import JobRef

__all__ = [
    "Experiment",
    "FileText",
    "Launched",
    "Match",
    "Matches",
    "MetricWanted",
    "Patched",
    "Tree",
    "TreeEntry",
    "WorkspaceView",
    "Written",
]

_T = TypeVar("_T")
_LOCAL = "local"  # the host name of a workspace on the monitor's own machine


@dataclass(frozen=True)
class TreeEntry:
    path: str  # relative to the workspace root
    kind: str  # "file", "directory", "symlink" or "other"
    size: int
    children_omitted: bool = False  # a directory not listed: skipped (.git, caches) or at the depth limit


@dataclass(frozen=True)
class Tree:
    entries: tuple[TreeEntry, ...]
    truncated: bool


@dataclass(frozen=True)
class FileText:
    content: str
    start_line: int
    end_line: int
    size: int
    truncated: bool
    binary: bool


@dataclass(frozen=True)
class Match:
    path: str
    line_number: int
    line: str


@dataclass(frozen=True)
class Matches:
    matches: tuple[Match, ...]
    truncated: bool


@dataclass(frozen=True)
class Written:
    size: int
    created: bool


@dataclass(frozen=True)
class Patched:
    modified: tuple[str, ...]
    created: tuple[str, ...]
    deleted: tuple[str, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return (*self.modified, *self.created, *self.deleted)


@dataclass(frozen=True)
class MetricWanted:
    """A number the monitor reads for a job: from its log (a pattern with one group) or a JSON-lines file."""

    name: str
    direction: Literal["minimize", "maximize"]
    log_regex: str = ""
    jsonl_path: str = ""  # relative to the job's working directory
    jsonl_key: str = ""


@dataclass(frozen=True)
class Experiment:
    """A job to run in the workspace: a command line (split into arguments, never run by a shell)."""

    command_line: str
    wall_clock_limit: float  # seconds; the monitor stops it past this
    working_directory: str = ""  # relative to the workspace root
    gpu_count: int = 0
    gpu_indices: tuple[int, ...] = ()
    metrics: tuple[MetricWanted, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Launched:
    job: JobRef
    gpus: tuple[int, ...]


class WorkspaceView:
    def __init__(self, client: MonitorClient, workspace_id: str) -> None:
        self._client = client
        self.workspace_id = workspace_id
        self._host: str | None = None

    async def _ask(self, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except grpc.aio.AioRpcError as error:
            raise MonitorError.of(error) from error

    async def tree(self, path: str = "", *, max_depth: int = 0) -> Tree:
        listing = await self._ask(self._client.list_workspace_tree(self.workspace_id, path, max_depth=max_depth))
        entries = tuple(
            TreeEntry(
                entry.path,
                enum_label(monitor_pb2.WorkspaceEntryKind, entry.kind),
                entry.size_bytes,
                entry.children_omitted,
            )
            for entry in listing.entries
        )
        return Tree(entries, listing.truncated)

    async def read(self, path: str, *, start_line: int = 0, end_line: int = 0) -> FileText:
        text = await self._ask(
            self._client.read_workspace_file(self.workspace_id, path, start_line=start_line, end_line=end_line)
        )
        return FileText(text.content, text.start_line, text.end_line, text.size_bytes, text.truncated, text.binary)

    async def search(self, pattern: str, *, path: str = "", glob: str = "", case_insensitive: bool = False) -> Matches:
        found = await self._ask(
            self._client.search_workspace(
                self.workspace_id, pattern, path=path, glob=glob, case_insensitive=case_insensitive
            )
        )
        return Matches(tuple(Match(m.path, m.line_number, m.line) for m in found.matches), found.truncated)

    async def write(self, path: str, content: str) -> Written:
        written = await self._ask(self._client.write_workspace_file(self.workspace_id, path, content))
        return Written(written.size_bytes, written.created)

    async def patch(self, patch: str) -> Patched:
        done = await self._ask(self._client.patch_workspace(self.workspace_id, patch))
        return Patched(tuple(done.modified_paths), tuple(done.created_paths), tuple(done.deleted_paths))

    async def launch(self, experiment: Experiment) -> Launched:
        """Start the job in the workspace, on its host; it runs on after this returns."""
        host = await self._workspace_host()
        options = monitor_pb2.JobOptions(
            workspace_id=self.workspace_id,
            environment=dict(experiment.environment),
            wall_clock_limit=duration(experiment.wall_clock_limit),
            gpus=monitor_pb2.GpuRequest(count=experiment.gpu_count, indices=experiment.gpu_indices),
            metrics=[_metric_spec(metric) for metric in experiment.metrics],
        )
        request = monitor_pb2.SubmitJobRequest(request_id=str(uuid.uuid4()), options=options)
        line, directory = experiment.command_line, experiment.working_directory
        if host == _LOCAL:
            request.local.CopyFrom(monitor_pb2.LocalCommand(command_line=line, working_directory=directory))
        else:  # the monitor runs it on the workspace's host
            request.remote.CopyFrom(monitor_pb2.RemoteCommand(command_line=line, working_directory=directory))
        submitted = await self._ask(self._client.submit_job(request))
        return Launched(job_ref_from_proto(submitted.job), tuple(submitted.gpu_indices))

    async def _workspace_host(self) -> str:
        if self._host is None:
            self._host = (await self._ask(self._client.get_workspace(self.workspace_id))).host
        return self._host


def _metric_spec(metric: MetricWanted) -> monitor_pb2.MetricSpec:
    spec = monitor_pb2.MetricSpec(
        name=metric.name, direction=monitor_pb2.MetricDirection.Value(f"METRIC_DIRECTION_{metric.direction.upper()}")
    )
    if metric.log_regex:
        spec.log_regex = metric.log_regex
    if metric.jsonl_path or metric.jsonl_key:
        spec.jsonl_file.CopyFrom(monitor_pb2.JsonlMetric(path=metric.jsonl_path, key=metric.jsonl_key))
    return spec
