"""What both sides of the workspace operations share: finding a workspace, resolving its paths, and git.

Every path a request names is checked in three steps: its form (relative, no "..", no NUL: else
INVALID_ARGUMENT), where it really leads (resolved on its host right before use; outside the
root: FAILED_PRECONDITION WORKSPACE_PATH_ESCAPES), and for a change, whether it or what it
resolves to is protected (writes.py). The path checks guard what callers of these RPCs can
reach; a process running in the workspace (a job) can change files between a check and its
use, as it can change anything its user may.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Sequence

from monitor_svc.idempotency import Once
from monitor_svc.ssh import SshHosts
from monitor_svc.workspaces import git
from monitor_svc.workspaces.backend import Backend
from monitor_svc.workspaces.local import LocalBackend
from monitor_svc.workspaces.paths import within
from monitor_svc.workspaces.registry import WorkspaceRegistry
from monitor_svc.workspaces.remote import SshBackend
from monitor_svc.workspaces.types import LOCAL, FileInfo, GitOutput, GitState, Workspace, WorkspaceRecord
from quarry.errors import ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument, NotFound

GIT_LISTING_BYTES = 4 * 1024 * 1024
REMEMBERED_REPLIES = 1024  # answers to recent changes, by request_id


def invalid(field: str, description: str) -> InvalidArgument:
    return InvalidArgument([FieldViolation(field, description)])


def wrong_kind(path: str, wanted: str) -> FailedPrecondition:
    return FailedPrecondition(f"{path or '.'} is not {wanted}", reason=ErrorReason.WORKSPACE_WRONG_KIND)


class WorkspaceAccess:
    """The workspaces' registry, their hosts' backends, one lock per workspace, and the answers by request_id."""

    def __init__(
        self, registry: WorkspaceRegistry, hosts: SshHosts, local_roots: Sequence[str], *, git_timeout: float
    ) -> None:
        self._registry = registry
        self._hosts = hosts
        self._local_roots = list(local_roots)
        self._backends: dict[str, Backend] = {LOCAL: LocalBackend(git_timeout)}
        self._backends.update({name: SshBackend(hosts, name, git_timeout) for name in hosts.names})
        self._locks: dict[str, asyncio.Lock] = {}
        self._replies = Once(remembered=REMEMBERED_REPLIES)

    def _allowed_roots(self, host: str) -> list[str]:
        if host == LOCAL:
            return self._local_roots
        return list(self._hosts.require(host).workspace_roots) if host in self._hosts.names else []

    def _lock(self, record: WorkspaceRecord) -> asyncio.Lock:
        return self._locks.setdefault(record.workspace_id, asyncio.Lock())

    async def _allowed_root(self, backend: Backend, resolved: str) -> str | None:
        for configured in self._allowed_roots(backend.host):
            if posixpath.isabs(configured) and within(resolved, await backend.realpath(configured)):
                return configured
        return None

    async def _workspace(self, workspace_id: str, field: str = "workspace_id") -> tuple[WorkspaceRecord, Backend]:
        record = await self._registry.get(workspace_id, field)
        if record.allowed_root not in self._allowed_roots(record.host):
            raise FailedPrecondition(
                f"{record.root} on {record.host} is no longer under a configured workspace root",
                reason=ErrorReason.WORKSPACE_ROOT_NOT_ALLOWED,
            )
        return record, self._backends[record.host]

    async def _describe(self, record: WorkspaceRecord, backend: Backend) -> Workspace:
        return Workspace(record, await self._git_state(record, backend))

    async def _resolve(self, record: WorkspaceRecord, backend: Backend, path: str) -> str:
        """Where `path` (normal form) leads on the host, which must be inside the root."""
        resolved = await backend.realpath(posixpath.join(record.root, path) if path else record.root)
        if not within(resolved, record.root):
            raise FailedPrecondition(
                f"{path or '.'} leads outside the workspace root through a symbolic link",
                reason=ErrorReason.WORKSPACE_PATH_ESCAPES,
                metadata={"path": path},
            )
        return resolved

    async def _existing(self, record: WorkspaceRecord, backend: Backend, path: str) -> tuple[str, FileInfo]:
        resolved = await self._resolve(record, backend, path)
        info = await backend.lstat(resolved)
        if info is None:
            raise NotFound("path", path or ".", field="path")
        return resolved, info

    # -- git -------------------------------------------------------------------------------------------

    async def _git(
        self,
        record: WorkspaceRecord,
        backend: Backend,
        *args: str,
        options: tuple[str, ...] = (),
        max_output: int = GIT_LISTING_BYTES,
        check: bool = True,
    ) -> GitOutput:
        environment = git.environment(record.root)
        listing = await backend.git(git.argv(record.root, *git.CONFIG_LISTING), environment, max_output=1 << 20)
        if listing.truncated:
            raise FailedPrecondition(
                f"the git configuration of {record.root} is too large to check", reason=ErrorReason.WORKSPACE_GIT_FAILED
            )
        if listing.status not in (0, 127) and not git.not_a_repository(listing.stderr):
            raise self._git_failed(record, "config", listing)  # a configuration git cannot read is not run
        # No git, or not a repository: the command fails the same way, and reads no configuration.
        disarmed = git.overrides(listing.stdout, args[0]) if listing.status == 0 else ()
        output = await backend.git(
            git.argv(record.root, *args, options=(*disarmed, *options)), environment, max_output=max_output
        )
        if check and output.status != 0 and not output.truncated:
            raise self._git_failed(record, args[0], output)
        return output

    @staticmethod
    def _git_failed(record: WorkspaceRecord, command: str, output: GitOutput) -> FailedPrecondition:
        if output.status == 127:
            return FailedPrecondition(f"git is not installed on {record.host}", reason=ErrorReason.WORKSPACE_GIT_FAILED)
        if git.not_a_repository(output.stderr):
            return FailedPrecondition(
                f"{record.root} on {record.host} is not the top of a git working tree",
                reason=ErrorReason.WORKSPACE_NOT_A_REPO,
            )
        message = output.stderr.strip()[-500:] or f"exit status {output.status}"
        return FailedPrecondition(f"git {command} failed: {message}", reason=ErrorReason.WORKSPACE_GIT_FAILED)

    async def _git_state(self, record: WorkspaceRecord, backend: Backend) -> GitState:
        output = await self._git(
            record,
            backend,
            "status",
            "--porcelain=v2",
            "--branch",
            "-z",
            "--untracked-files=normal",
            max_output=64 * 1024,  # enough to know it is dirty
            check=False,
        )
        if output.status != 0 and not output.truncated:
            if output.status == 127 or git.not_a_repository(output.stderr):
                return GitState(is_repo=False)
            raise self._git_failed(record, "status", output)
        return git.parse_status(output.stdout, truncated=output.truncated)

    async def _repository(self, record: WorkspaceRecord, backend: Backend) -> GitState:
        state = await self._git_state(record, backend)
        if not state.is_repo:
            raise FailedPrecondition(
                f"{record.root} on {record.host} is not the top of a git working tree",
                reason=ErrorReason.WORKSPACE_NOT_A_REPO,
            )
        return state

    async def _commit_of(self, record: WorkspaceRecord, backend: Backend, revision: str, field: str) -> str:
        verify = ("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
        output = await self._git(record, backend, *verify, check=False)
        commit = output.stdout.decode(errors="replace").strip()
        if output.status != 0 or not commit:
            raise FailedPrecondition(
                f"{field} {revision!r} names no commit in {record.root}",
                reason=ErrorReason.WORKSPACE_GIT_FAILED,
                metadata={field: revision},
            )
        return commit
