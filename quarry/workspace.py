"""One workspace of the monitor's, in domain terms, over MonitorClient: files, search, edits, git and jobs.

A view is bound to one workspace_id when it is made; nothing it offers names another, so whoever
holds it (an engineer's tools, a campaign's loop) reaches that workspace and no other. The monitor
enforces the rest: paths stay inside the root, protected paths are never written, jobs run there.
This is the one place a monitor request for a workspace is built (a job's, with its metrics, among
them); its failures are raised as MonitorError, in the QuarryError tree. Nothing here calls a model.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from quarry.clients.monitor import MonitorClient
from quarry.compute import ComputeView, JobReport, MonitorError
from quarry.convert import duration, enum_label, job_ref_from_proto, metric_spec_to_proto
from quarry.v1 import monitor_pb2
from quarry.vocabulary import JobRef, MetricDirection

__all__ = [
    "Committed",
    "Experiment",
    "FileText",
    "GitState",
    "Launched",
    "Match",
    "Matches",
    "MetricWanted",
    "Patched",
    "SlurmScript",
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
    direction: MetricDirection
    log_regex: str = ""
    jsonl_path: str = ""  # relative to the job's working directory
    jsonl_key: str = ""


@dataclass(frozen=True)
class SlurmScript:
    """A batch script sbatch submits on the workspace's (SSH) host; the job starts in the workspace root."""

    script_path: str  # relative to the workspace root
    sbatch_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Experiment:
    """A job to run in the workspace: a command line (split into arguments, never run by a shell), or argv
    instead, or a Slurm batch script instead."""

    command_line: str
    wall_clock_limit: float  # seconds; the monitor stops it past this
    working_directory: str = ""  # relative to the workspace root
    gpu_count: int = 0
    gpu_indices: tuple[int, ...] = ()
    metrics: tuple[MetricWanted, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    slurm: SlurmScript | None = None
    isolate_network: bool = False  # a local job in the monitor's sandbox: no network namespace but its own


@dataclass(frozen=True)
class GitState:
    branch: str
    head_commit: str
    is_repo: bool = True  # the root is the top of a git working tree


@dataclass(frozen=True)
class Committed:
    commit: str  # the new commit; the unchanged HEAD when there was nothing to commit
    changed: bool  # whether the workspace held a change (as git status has it) to commit
    paths: tuple[str, ...] = ()  # what the commit changed, however it was changed (a command's edits too)


@dataclass(frozen=True)
class Launched:
    job: JobRef
    gpus: tuple[int, ...]


class WorkspaceView:
    def __init__(self, client: MonitorClient, workspace_id: str, *, host: str | None = None) -> None:
        self._client = client
        self.workspace_id = workspace_id
        self._host = host  # None: asked of the monitor when a job is launched

    @classmethod
    async def open(
        cls, client: MonitorClient, root: str, *, host: str, protected_paths: Sequence[str], request_id: str
    ) -> tuple[WorkspaceView, GitState]:
        """Open (or find again: the id depends only on host and root) a directory under a workspace root."""
        try:
            workspace = await client.open_workspace(
                root, host=host, protected_paths=protected_paths, request_id=request_id
            )
        except grpc.aio.AioRpcError as error:
            raise MonitorError.of(error) from error
        return cls(client, workspace.workspace_id, host=workspace.host), _git(workspace)

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

    async def git(self) -> GitState:
        return _git(await self._ask(self._client.get_workspace(self.workspace_id)))

    async def branch(self, name: str, *, request_id: str) -> GitState:
        """Create the branch and check it out (a repeated request_id answers the first result)."""
        return _git(
            await self._ask(self._client.create_workspace_branch(self.workspace_id, name, request_id=request_id))
        )

    async def commit(self, message: str, *, request_id: str) -> Committed:
        """Commit every change in the workspace, however it was made (file writes, commands): the new commit,
        or HEAD and `changed` false when git sees nothing to commit."""
        committed = await self._ask(self._client.commit_workspace(self.workspace_id, message, request_id=request_id))
        return Committed(committed.commit, committed.committed, tuple(committed.changed_paths))

    async def reset(self, commit: str, *, remove_untracked: bool = False) -> GitState:
        """Put the workspace back at `commit`, files and HEAD (untracked files too, if asked)."""
        reset = self._client.reset_workspace(self.workspace_id, commit, remove_untracked=remove_untracked)
        return _git(await self._ask(reset))

    async def launch(self, experiment: Experiment, *, request_id: str = "") -> Launched:
        """Start the job in the workspace, on its host; it runs on after this returns. A repeated request_id
        gets the job it started back (a fresh one is used unless given)."""
        options = monitor_pb2.JobOptions(
            workspace_id=self.workspace_id,
            environment=dict(experiment.environment),
            wall_clock_limit=duration(experiment.wall_clock_limit),
            gpus=monitor_pb2.GpuRequest(count=experiment.gpu_count, indices=experiment.gpu_indices),
            metrics=[_metric_spec(metric) for metric in experiment.metrics],
            isolate_network=experiment.isolate_network,
        )
        request = monitor_pb2.SubmitJobRequest(request_id=request_id or str(uuid.uuid4()), options=options)
        line, argv, directory = experiment.command_line, experiment.argv, experiment.working_directory
        if experiment.slurm is not None:  # on the workspace's host, which must be an SSH host
            slurm = experiment.slurm
            request.slurm.CopyFrom(
                monitor_pb2.SlurmSubmission(script_path=slurm.script_path, sbatch_args=slurm.sbatch_args)
            )
        elif await self._workspace_host() == _LOCAL:
            request.local.CopyFrom(monitor_pb2.LocalCommand(command_line=line, argv=argv, working_directory=directory))
        else:  # the monitor runs it on the workspace's host
            request.remote.CopyFrom(
                monitor_pb2.RemoteCommand(command_line=line, argv=argv, working_directory=directory)
            )
        submitted = await self._ask(self._client.submit_job(request))
        return Launched(job_ref_from_proto(submitted.job), tuple(submitted.gpu_indices))

    def watch(self, job: JobRef, *, deadline_seconds: float, poll_seconds: int = 2) -> AsyncIterator[JobReport]:
        """The job's reports until it ends, or `deadline_seconds` pass (a MonitorError then)."""
        return ComputeView(self._client).watch(job, deadline_seconds=deadline_seconds, poll_seconds=poll_seconds)

    async def _workspace_host(self) -> str:
        if self._host is None:
            self._host = (await self._ask(self._client.get_workspace(self.workspace_id))).host
        return self._host


def _git(workspace: monitor_pb2.Workspace) -> GitState:
    return GitState(workspace.git.branch, workspace.git.head_commit, workspace.git.is_repo)


def _metric_spec(metric: MetricWanted) -> monitor_pb2.MetricSpec:
    return metric_spec_to_proto(
        metric.name,
        metric.direction,
        log_regex=metric.log_regex,
        jsonl_path=metric.jsonl_path,
        jsonl_key=metric.jsonl_key,
    )
