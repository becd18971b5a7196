"""The workspace operations that change it: open, write, patch, and git's branch, commit and reset.

Changes to one workspace run one at a time, each once per request_id. A change to a protected
path, or to what a path resolves to, is refused (FAILED_PRECONDITION WORKSPACE_PATH_PROTECTED
naming the rule). Git operations that would change a protected path on disk are refused unless
its content stays the same: a reset or a branch from another start point is checked against the
paths that differ between the working tree (or HEAD) and the target, a removal of untracked
files against those files. A commit changes nothing on disk and is allowed.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Sequence

from monitor_svc.idempotency import check_request_id
from monitor_svc.validation import refuse_nul
from monitor_svc.workspaces import git
from monitor_svc.workspaces.access import WorkspaceAccess, invalid, wrong_kind
from monitor_svc.workspaces.backend import Backend
from monitor_svc.workspaces.patch import FilePatch, HunkFailed, PatchSyntaxError, apply_file_patch, parse_patch
from monitor_svc.workspaces.paths import (
    GIT_DIR,
    MAX_PATH_CHARS,
    protected_rules,
    protecting_rule,
    relative_path,
    relative_to,
)
from monitor_svc.workspaces.registry import workspace_id
from monitor_svc.workspaces.types import (
    LOCAL,
    Commit,
    EntryKind,
    FileInfo,
    Patched,
    Workspace,
    WorkspaceRecord,
    Written,
)
from quarry.errors import AlreadyExists, ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument, QuarryError

MAX_FILE_BYTES = 4 * 1024 * 1024  # a file written, or patched
MAX_PATCH_BYTES = 4 * 1024 * 1024


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _protected(path: str, rule: str, doing: str = "") -> FailedPrecondition:
    why = "git's own directory .git is never written" if rule == GIT_DIR else f"it is protected by the rule {rule!r}"
    return FailedPrecondition(
        f"{doing or path} is refused: {path} is read-only ({why})",
        reason=ErrorReason.WORKSPACE_PATH_PROTECTED,
        metadata={"path": path, "rule": rule},
    )


def _relative(value: str, field: str) -> str:
    """A path named inside a patch, in normal form; its violation quotes it (the field is the whole patch)."""
    try:
        return relative_path(value, field)
    except InvalidArgument as error:
        violations = [FieldViolation(field, f"{value!r}: {violation.description}") for violation in error.violations]
        raise InvalidArgument(violations, reason=error.reason) from None


# The paths a commit reports changed, at most.
MAX_CHANGED_PATHS = 10_000


class WorkspaceWrites(WorkspaceAccess):
    async def open(self, host: str, root: str, protected: Sequence[str], request_id: str) -> Workspace:
        refuse_nul({"host": host, "root": root, **{f"protected_paths[{i}]": p for i, p in enumerate(protected)}})
        check_request_id(request_id)
        host = host or LOCAL
        if host != LOCAL:
            self._hosts.require(host, field="host")
        if not root or len(root) > MAX_PATH_CHARS or not posixpath.isabs(root):
            raise invalid("root", f"required: an absolute directory on the host, at most {MAX_PATH_CHARS} characters")
        rules = protected_rules(protected)
        return await self._replies.once(request_id, ("open", host, root, rules), lambda: self._open(host, root, rules))

    async def _open(self, host: str, root: str, rules: tuple[str, ...]) -> Workspace:
        backend = self._backends[host]
        resolved = await backend.realpath(root)
        # The roots first: whether a path elsewhere exists is none of the caller's business.
        allowed = await self._allowed_root(backend, resolved)
        if allowed is None:
            configured = ", ".join(self._allowed_roots(host)) or "none are configured"
            raise FailedPrecondition(
                f"{root} on {host} is outside the directories workspaces may be opened in ({configured})",
                reason=ErrorReason.WORKSPACE_ROOT_NOT_ALLOWED,
            )
        info = await backend.lstat(resolved)
        if info is None or info.kind is not EntryKind.DIRECTORY:
            raise FailedPrecondition(
                f"{root} on {host} is not an existing directory", reason=ErrorReason.WORKSPACE_ROOT_INVALID
            )
        record = WorkspaceRecord(workspace_id(host, resolved), host, resolved, rules, allowed)
        async with self._lock(record):  # two opens at once: one record, whichever comes first
            existing = await self._registry.find(record.workspace_id)
            if existing is not None and existing.protected_paths != rules:
                raise AlreadyExists(
                    f"{resolved} on {host} is open as {existing.workspace_id} with the protected paths "
                    f"{list(existing.protected_paths)}; open it with the same ones",
                    reason=ErrorReason.WORKSPACE_EXISTS,
                )
            if existing != record:
                await self._registry.save(record)
        return await self._describe(record, backend)

    @staticmethod
    def _check_writable(record: WorkspaceRecord, path: str, resolved: str | None = None) -> None:
        for candidate in (path, relative_to(resolved, record.root) if resolved is not None else None):
            if candidate:
                rule = protecting_rule(candidate, record.protected_paths)
                if rule is not None:
                    raise _protected(path, rule)

    async def _writable(self, record: WorkspaceRecord, backend: Backend, path: str) -> tuple[str, FileInfo | None]:
        """(resolved path, its metadata or None) of a file that may be written: inside, unprotected, not a directory."""
        self._check_writable(record, path)
        resolved = await self._resolve(record, backend, path)
        self._check_writable(record, path, resolved)
        info = await backend.lstat(resolved)
        if info is not None and info.kind is not EntryKind.FILE:
            raise wrong_kind(path, "a regular file")
        return resolved, info

    async def _make_parents(self, backend: Backend, resolved: str, path: str) -> None:
        parent = posixpath.dirname(resolved)
        info = await backend.lstat(parent)
        if info is None:
            await backend.makedirs(parent)
        elif info.kind is not EntryKind.DIRECTORY:
            raise wrong_kind(posixpath.dirname(path), "a directory")

    async def write(self, workspace_id: str, path: str, content: str, request_id: str) -> Written:
        name = relative_path(path, "path")
        data = content.encode(errors="surrogateescape")
        if len(data) > MAX_FILE_BYTES:
            raise invalid("content", f"at most {MAX_FILE_BYTES} bytes")
        check_request_id(request_id)
        record, backend = await self._workspace(workspace_id)

        async def write() -> Written:
            async with self._lock(record):
                resolved, info = await self._writable(record, backend, name)
                if info is None:
                    await self._make_parents(backend, resolved, name)
                await backend.write(resolved, data, info.mode if info else None)
                return Written(len(data), created=info is None)

        return await self._replies.once(request_id, ("write", workspace_id, name, _digest(data)), write)

    async def patch(self, workspace_id: str, text: str, request_id: str) -> Patched:
        if not text:
            raise invalid("patch", "required: a unified diff")
        if len(text.encode(errors="surrogateescape")) > MAX_PATCH_BYTES:
            raise invalid("patch", f"at most {MAX_PATCH_BYTES} bytes")
        check_request_id(request_id)
        try:
            patches = [
                FilePatch(
                    _relative(p.old_path, "patch") if p.old_path is not None else None,
                    _relative(p.new_path, "patch") if p.new_path is not None else None,
                    p.hunks,
                )
                for p in parse_patch(text)
            ]
        except PatchSyntaxError as error:
            raise invalid("patch", str(error)) from None
        record, backend = await self._workspace(workspace_id)

        async def patch() -> Patched:
            async with self._lock(record):
                return await self._patch(record, backend, patches)

        return await self._replies.once(request_id, ("patch", workspace_id, _digest(text.encode())), patch)

    async def _patch(self, record: WorkspaceRecord, backend: Backend, patches: list[FilePatch]) -> Patched:
        for patch in patches:  # every protected path refused before any file is read
            for path in (patch.old_path, patch.new_path):
                if path is not None:
                    self._check_writable(record, path)
        # Everything is computed in memory first; nothing is written unless every hunk applies.
        originals: dict[str, tuple[str, FileInfo | None, bytes | None]] = {}
        current: dict[str, str | None] = {}

        async def content(path: str) -> str | None:
            if path not in current:
                resolved, info = await self._writable(record, backend, path)
                data = None
                if info is not None:
                    if info.size > MAX_FILE_BYTES:
                        raise FailedPrecondition(
                            f"{path} is larger than {MAX_FILE_BYTES} bytes: too large to patch",
                            reason=ErrorReason.WORKSPACE_PATCH_FAILED,
                        )
                    data, _ = await backend.read(resolved, MAX_FILE_BYTES)
                originals[path] = (resolved, info, data)
                current[path] = data.decode(errors="surrogateescape") if data is not None else None
            return current[path]

        for patch in patches:
            try:
                result = apply_file_patch(patch, await content(patch.old_path or patch.path))
                if patch.old_path is not None and patch.new_path not in (None, patch.old_path):
                    if await content(patch.path) is not None:
                        why = f"the patch renames {patch.old_path} onto it, but it exists"
                        raise HunkFailed(patch.path, None, "", why)
                    current[patch.old_path] = None
            except HunkFailed as error:
                raise FailedPrecondition(
                    str(error),
                    reason=ErrorReason.WORKSPACE_PATCH_FAILED,
                    metadata={"path": error.path, "hunk": str(error.hunk or 0)},
                ) from None
            if result is not None and len(result.encode(errors="surrogateescape")) > MAX_FILE_BYTES:
                raise FailedPrecondition(
                    f"{patch.path} would be larger than {MAX_FILE_BYTES} bytes",
                    reason=ErrorReason.WORKSPACE_PATCH_FAILED,
                )
            current[patch.path] = result
        changes = [
            (path, text)
            for path, text in current.items()
            if (originals[path][2] is None) != (text is None)
            or (text is not None and text.encode(errors="surrogateescape") != originals[path][2])
        ]
        await self._commit_changes(backend, originals, changes)
        done = Patched()
        for path, text in changes:
            was = originals[path][2]
            (done.deleted if text is None else done.created if was is None else done.modified).append(path)
        return done

    async def _commit_changes(
        self,
        backend: Backend,
        originals: dict[str, tuple[str, FileInfo | None, bytes | None]],
        changes: list[tuple[str, str | None]],
    ) -> None:
        """Write every change; if one fails, put back the files already changed (all or none)."""
        done: list[str] = []
        try:
            for path, text in changes:
                resolved, info, _ = originals[path]
                if text is None:
                    await backend.remove(resolved)
                else:
                    if info is None:
                        await self._make_parents(backend, resolved, path)
                    await backend.write(resolved, text.encode(errors="surrogateescape"), info.mode if info else None)
                done.append(path)
        except BaseException:
            for path in reversed(done):
                resolved, info, data = originals[path]
                try:
                    if data is None:
                        await backend.remove(resolved)
                    else:
                        await backend.write(resolved, data, info.mode if info else None)
                except QuarryError:
                    pass  # the first failure is the one to report
            raise

    async def _names(self, record: WorkspaceRecord, backend: Backend, *args: str) -> list[str]:
        """The paths a `-z` git listing prints; all of them, or the operation is refused."""
        output = await self._git(record, backend, *args)
        if output.truncated:
            raise FailedPrecondition(
                f"git {args[0]} lists too many paths to check against the protected ones",
                reason=ErrorReason.WORKSPACE_GIT_FAILED,
            )
        return git.nul_separated(output.stdout)

    def _refuse_protected_changes(self, record: WorkspaceRecord, paths: Sequence[str], doing: str) -> None:
        for path in paths:
            rule = protecting_rule(path, record.protected_paths)
            if rule is not None:
                raise _protected(path, rule, doing)

    async def create_branch(self, workspace_id: str, branch: str, start_point: str, request_id: str) -> Workspace:
        git.check_branch(branch)
        if start_point:
            git.check_revision(start_point, "start_point")
        check_request_id(request_id)
        record, backend = await self._workspace(workspace_id)

        async def create() -> Workspace:
            async with self._lock(record):
                state = await self._repository(record, backend)
                named = await self._git(record, backend, "check-ref-format", "--branch", branch, check=False)
                if named.status != 0:
                    raise invalid("branch", f"{branch!r} is not a valid git branch name")
                if start_point:
                    target = await self._commit_of(record, backend, start_point, "start_point")
                    changed = await self._names(
                        record,
                        backend,
                        *(
                            ("diff", "--name-only", "-z", "--no-renames", state.head_commit, target)
                            if state.head_commit
                            else ("ls-tree", "-r", "--name-only", "-z", target)
                        ),
                    )
                    self._refuse_protected_changes(record, changed, f"checking out {start_point}")
                    await self._git(record, backend, "checkout", "-q", "-b", branch, target)
                else:
                    await self._git(record, backend, "checkout", "-q", "-b", branch)
                return await self._describe(record, backend)

        return await self._replies.once(request_id, ("branch", workspace_id, branch, start_point), create)

    async def commit(self, workspace_id: str, message: str, request_id: str) -> Commit:
        """Commit every change under the root (`git add -A`), however it was made; what it changed."""
        git.check_message(message)
        check_request_id(request_id)
        record, backend = await self._workspace(workspace_id)

        async def commit() -> Commit:
            async with self._lock(record):
                state = await self._repository(record, backend)
                if not state.dirty:
                    return Commit(state.head_commit, committed=False)
                await self._git(record, backend, "add", "-A")
                staged = await self._git(
                    record, backend, "diff", *git.QUIET_DIFF_OPTIONS, "--cached", "--quiet", check=False
                )
                if staged.status == 0:
                    return Commit(state.head_commit, committed=False)
                listed = await self._git(
                    record, backend, "diff", *git.QUIET_DIFF_OPTIONS, "--cached", "--name-only", "--no-renames", "-z"
                )
                paths = [path.decode(errors="replace") for path in listed.stdout.split(b"\0") if path]
                await self._git(record, backend, "commit", "-q", "-m", message, options=git.IDENTITY)
                return Commit(
                    await self._commit_of(record, backend, "HEAD", "HEAD"),
                    committed=True,
                    changed_paths=tuple(paths[:MAX_CHANGED_PATHS]),
                    changed_paths_truncated=listed.truncated or len(paths) > MAX_CHANGED_PATHS,
                )

        return await self._replies.once(request_id, ("commit", workspace_id, message), commit)

    async def reset(self, workspace_id: str, commit: str, remove_untracked: bool, request_id: str) -> Workspace:
        git.check_revision(commit, "commit")
        check_request_id(request_id)
        record, backend = await self._workspace(workspace_id)

        async def reset() -> Workspace:
            async with self._lock(record):
                await self._repository(record, backend)
                target = await self._commit_of(record, backend, commit, "commit")
                doing = f"resetting to {commit}"
                changed = await self._names(record, backend, "diff", "--name-only", "-z", "--no-renames", target)
                self._refuse_protected_changes(record, changed, doing)
                if remove_untracked:
                    untracked = await self._names(record, backend, "ls-files", "--others", "--exclude-standard", "-z")
                    self._refuse_protected_changes(record, untracked, f"{doing} and removing untracked files")
                await self._git(record, backend, "reset", "-q", "--hard", target)
                if remove_untracked:
                    await self._git(record, backend, "clean", "-f", "-d", "-q")
                return await self._describe(record, backend)

        return await self._replies.once(request_id, ("reset", workspace_id, commit, remove_untracked), reset)
