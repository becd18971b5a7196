"""The workspace operations, written once over a Backend: open, describe, list, read, search, write, patch, git.

Every path a request names is checked in three steps: its form (relative, no "..", no NUL: else
INVALID_ARGUMENT), where it really leads (resolved on its host right before use; outside the
root: FAILED_PRECONDITION WORKSPACE_PATH_ESCAPES), and for a change, whether it or what it
resolves to is protected (FAILED_PRECONDITION WORKSPACE_PATH_PROTECTED naming the rule).

Git operations that would change a protected path on disk are refused unless its content stays
the same: a reset or a branch from another start point is checked against the paths that differ
between the working tree (or HEAD) and the target, a removal of untracked files against those
files. A commit changes nothing on disk and is allowed.

Changes to one workspace (writes, patches, git) run one at a time; reads do not wait. The
path checks guard what callers of these RPCs can reach; a process running in the workspace
(a job) can change files between a check and its use, as it can change anything its user may.
"""

from __future__ import annotations

import asyncio
import hashlib
import posixpath
import re
from collections import deque
from collections.abc import AsyncIterator, Sequence
from fnmatch import fnmatchcase
from typing import TypeVar

from monitor_svc.idempotency import Once, check_request_id
from monitor_svc.ssh import SshHosts
from monitor_svc.validation import refuse_nul
from monitor_svc.workspaces import git
from monitor_svc.workspaces.backend import Backend
from monitor_svc.workspaces.grep import SearchTooSlow, search
from monitor_svc.workspaces.local import LocalBackend
from monitor_svc.workspaces.model import (
    LOCAL,
    Commit,
    Diff,
    EntryKind,
    FileInfo,
    FileText,
    GitOutput,
    GitState,
    Patched,
    SearchMatch,
    SearchResult,
    Tree,
    TreeEntry,
    Workspace,
    WorkspaceRecord,
    Written,
)
from monitor_svc.workspaces.patch import (
    FilePatch,
    HunkFailed,
    PatchSyntaxError,
    apply_file_patch,
    parse_patch,
    split_lines,
)
from monitor_svc.workspaces.paths import (
    GIT_DIR,
    MAX_PATH_CHARS,
    SKIPPED_DIRS,
    protected_rules,
    protecting_rule,
    relative_path,
    relative_to,
    within,
)
from monitor_svc.workspaces.registry import WorkspaceRegistry, check_workspace_id, workspace_id
from monitor_svc.workspaces.remote import SshBackend
from quarry.errors import (
    AlreadyExists,
    ErrorReason,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    QuarryError,
)

_T = TypeVar("_T")
MAX_FILE_BYTES = 4 * 1024 * 1024  # a file written, or patched
MAX_PATCH_BYTES = 4 * 1024 * 1024
READ_SCAN_BYTES = 16 * 1024 * 1024  # how far into a file ReadWorkspaceFile looks for lines
BINARY_PROBE_BYTES = 8000  # as git: a NUL in the first 8000 bytes makes a file binary
DEFAULT_READ_BYTES, MAX_READ_BYTES = 64 * 1024, 1024 * 1024
DEFAULT_DEPTH, MAX_DEPTH = 3, 16
DEFAULT_ENTRIES, MAX_ENTRIES = 500, 5000
DEFAULT_MATCHES, MAX_MATCHES = 100, 1000
MAX_PATTERN_CHARS = 1000
SEARCH_FILE_BYTES = 4 * 1024 * 1024  # larger files are not searched
SEARCH_BYTES = 32 * 1024 * 1024
SEARCH_FILES = 5000
SEARCH_SECONDS = 20.0
DEFAULT_DIFF_BYTES, MAX_DIFF_BYTES = 256 * 1024, 4 * 1024 * 1024
GIT_LISTING_BYTES = 4 * 1024 * 1024
MAX_UNTRACKED_SHOWN = 1000
REMEMBERED_REPLIES = 1024  # answers to recent changes, by request_id


def _invalid(field: str, description: str) -> InvalidArgument:
    return InvalidArgument([FieldViolation(field, description)])


def _bounded(value: int, field: str, *, default: int, maximum: int) -> int:
    if not 0 <= value <= maximum:
        raise _invalid(field, f"between 0 (the default, {default}) and {maximum}")
    return value or default


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _protected(path: str, rule: str, doing: str = "") -> FailedPrecondition:
    why = "git's own directory .git is never written" if rule == GIT_DIR else f"it is protected by the rule {rule!r}"
    return FailedPrecondition(
        f"{doing or path} is refused: {path} is read-only ({why})",
        reason=ErrorReason.WORKSPACE_PATH_PROTECTED,
        metadata={"path": path, "rule": rule},
    )


def _wrong_kind(path: str, wanted: str) -> FailedPrecondition:
    return FailedPrecondition(f"{path or '.'} is not {wanted}", reason=ErrorReason.WORKSPACE_WRONG_KIND)


def _relative(value: str, field: str) -> str:
    """A path named inside a patch, in normal form; its violation quotes it (the field is the whole patch)."""
    try:
        return relative_path(value, field)
    except InvalidArgument as error:
        violations = [FieldViolation(field, f"{value!r}: {violation.description}") for violation in error.violations]
        raise InvalidArgument(violations, reason=error.reason) from None


class Workspaces:
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

    # -- opening and finding ----------------------------------------------------------------------

    async def open(self, host: str, root: str, protected: Sequence[str], request_id: str) -> Workspace:
        refuse_nul({"host": host, "root": root, **{f"protected_paths[{i}]": p for i, p in enumerate(protected)}})
        check_request_id(request_id)
        host = host or LOCAL
        if host != LOCAL:
            self._hosts.require(host, field="host")
        if not root or len(root) > MAX_PATH_CHARS or not posixpath.isabs(root):
            raise _invalid("root", f"required: an absolute directory on the host, at most {MAX_PATH_CHARS} characters")
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

    async def get(self, workspace_id: str) -> Workspace:
        record, backend = await self._workspace(workspace_id)
        return await self._describe(record, backend)

    async def _describe(self, record: WorkspaceRecord, backend: Backend) -> Workspace:
        return Workspace(record, await self._git_state(record, backend))

    # -- paths ----------------------------------------------------------------------------------------

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
            raise _wrong_kind(path, "a regular file")
        return resolved, info

    async def _make_parents(self, backend: Backend, resolved: str, path: str) -> None:
        parent = posixpath.dirname(resolved)
        info = await backend.lstat(parent)
        if info is None:
            await backend.makedirs(parent)
        elif info.kind is not EntryKind.DIRECTORY:
            raise _wrong_kind(posixpath.dirname(path), "a directory")

    async def _existing(self, record: WorkspaceRecord, backend: Backend, path: str) -> tuple[str, FileInfo]:
        resolved = await self._resolve(record, backend, path)
        info = await backend.lstat(resolved)
        if info is None:
            raise NotFound("path", path or ".", field="path")
        return resolved, info

    # -- jobs ------------------------------------------------------------------------------------------

    async def job_path(
        self, workspace_id: str, path: str, field: str, *, directory: bool
    ) -> tuple[WorkspaceRecord, str]:
        """Where a job in the workspace starts (a directory; "" is the root) or the script it submits (a
        file): `path` checked by the same rules as every workspace path, then resolved on its host."""
        check_workspace_id(workspace_id, "options.workspace_id")
        name = relative_path(path, field, allow_root=directory)
        record, backend = await self._workspace(workspace_id, "options.workspace_id")
        resolved = await self._resolve(record, backend, name)
        info = await backend.lstat(resolved)
        if info is None:
            raise NotFound("path", name or ".", field=field)
        wanted = EntryKind.DIRECTORY if directory else EntryKind.FILE
        if info.kind is not wanted:
            raise _wrong_kind(name, "a directory" if directory else "a regular file")
        return record, resolved

    # -- reading --------------------------------------------------------------------------------------

    async def tree(self, workspace_id: str, path: str, max_depth: int, max_entries: int) -> Tree:
        depth = _bounded(max_depth, "max_depth", default=DEFAULT_DEPTH, maximum=MAX_DEPTH)
        limit = _bounded(max_entries, "max_entries", default=DEFAULT_ENTRIES, maximum=MAX_ENTRIES)
        start = relative_path(path, "path", allow_root=True)
        record, backend = await self._workspace(workspace_id)
        resolved, info = await self._existing(record, backend, start)
        if info.kind is not EntryKind.DIRECTORY:
            raise _wrong_kind(start, "a directory")
        entries: list[TreeEntry] = []
        # Breadth first: when the entries run out, what is listed is the top of the tree.
        queue = deque([(resolved, start, 1)])
        while queue:
            directory, prefix, level = queue.popleft()
            for name, child in sorted(await backend.listdir(directory), key=lambda item: item[0]):
                if len(entries) == limit:
                    return Tree(sorted(entries, key=lambda entry: entry.path), truncated=True)
                relative = f"{prefix}/{name}" if prefix else name
                is_dir = child.kind is EntryKind.DIRECTORY
                descend = is_dir and name not in SKIPPED_DIRS and level < depth
                entries.append(TreeEntry(relative, child.kind, child.size, children_omitted=is_dir and not descend))
                if descend:
                    queue.append((posixpath.join(directory, name), relative, level + 1))
        return Tree(sorted(entries, key=lambda entry: entry.path), truncated=False)

    async def read(self, workspace_id: str, path: str, start_line: int, end_line: int, max_bytes: int) -> FileText:
        name = relative_path(path, "path")
        if start_line < 0:
            raise _invalid("start_line", "from 1 (0: the first line)")
        if end_line < 0 or (end_line and end_line < max(start_line, 1)):
            raise _invalid("end_line", "0 (the end of the file) or at least start_line")
        cap = _bounded(max_bytes, "max_bytes", default=DEFAULT_READ_BYTES, maximum=MAX_READ_BYTES)
        first = start_line or 1
        record, backend = await self._workspace(workspace_id)
        resolved, info = await self._existing(record, backend, name)
        if info.kind is not EntryKind.FILE:
            raise _wrong_kind(name, "a regular file")
        data, size = await backend.read(resolved, READ_SCAN_BYTES)
        if b"\x00" in data[:BINARY_PROBE_BYTES]:
            return FileText("", 0, 0, size, truncated=False, binary=True)
        whole = len(data) >= size
        lines = split_lines(data.decode(errors="replace"))
        if not whole and lines:
            lines.pop()  # cut by the scan limit: not a whole line
        wanted = lines[first - 1 : end_line or None]
        chosen: list[str] = []
        used = 0
        for line in wanted:
            used += len(line.encode())
            if used > cap:
                break
            chosen.append(line)
        truncated = len(chosen) < len(wanted) or (not whole and (not end_line or end_line > len(lines)))
        if not chosen and wanted:  # one line longer than the cap: its beginning
            chosen = [wanted[0].encode()[:cap].decode(errors="ignore")]
        last = first + len(chosen) - 1 if chosen else 0
        return FileText("".join(chosen), first if chosen else 0, last, size, truncated)

    async def search(
        self, workspace_id: str, pattern: str, path: str, glob: str, case_insensitive: bool, max_matches: int
    ) -> SearchResult:
        if not pattern or len(pattern) > MAX_PATTERN_CHARS:
            raise _invalid("pattern", f"required: a regular expression of at most {MAX_PATTERN_CHARS} characters")
        flags = re.IGNORECASE if case_insensitive else 0
        try:
            re.compile(pattern, flags)
        except (re.error, OverflowError, RecursionError, ValueError) as error:
            raise _invalid("pattern", f"not a valid Python regular expression: {error}") from None
        refuse_nul({"glob": glob})
        if len(glob) > MAX_PATH_CHARS:
            raise _invalid("glob", f"at most {MAX_PATH_CHARS} characters")
        limit = _bounded(max_matches, "max_matches", default=DEFAULT_MATCHES, maximum=MAX_MATCHES)
        start = relative_path(path, "path", allow_root=True)
        record, backend = await self._workspace(workspace_id)
        resolved, info = await self._existing(record, backend, start)
        texts: list[tuple[str, str]] = []
        scanned = 0
        complete = True
        async for name, file_path, size in self._files(backend, resolved, start, info, glob):
            if len(texts) == SEARCH_FILES or scanned + size > SEARCH_BYTES:
                complete = False
                break
            data, _ = await backend.read(file_path, SEARCH_FILE_BYTES)
            scanned += len(data)
            if b"\x00" not in data[:BINARY_PROBE_BYTES]:
                texts.append((name, data.decode(errors="replace")))
        try:
            found = await search(pattern, flags, texts, limit, SEARCH_SECONDS)
        except SearchTooSlow:
            raise FailedPrecondition(
                f"the search did not finish within {SEARCH_SECONDS:g} s: simplify the pattern "
                "(nested repetition backtracks) or search a narrower path",
                reason=ErrorReason.WORKSPACE_SEARCH_TOO_SLOW,
            ) from None
        matches = [SearchMatch(*match) for match in found[:limit]]
        return SearchResult(matches, len(found) > limit or not complete, len(texts), scanned)

    async def _files(
        self, backend: Backend, resolved: str, start: str, info: FileInfo, glob: str
    ) -> AsyncIterator[tuple[str, str, int]]:
        """(relative path, host path, size) of each file to search, in path order, skipping tools' directories."""
        if info.kind is EntryKind.FILE:
            name = posixpath.basename(start)
            if info.size <= SEARCH_FILE_BYTES and (not glob or fnmatchcase(start, glob) or fnmatchcase(name, glob)):
                yield start, resolved, info.size
            return
        if info.kind is not EntryKind.DIRECTORY:
            raise _wrong_kind(start, "a file or a directory")
        stack = [(resolved, start)]
        while stack:
            directory, prefix = stack.pop()
            children = sorted(await backend.listdir(directory), key=lambda item: item[0], reverse=True)
            for name, child in children:  # reversed onto the stack: visited in name order
                relative = f"{prefix}/{name}" if prefix else name
                if child.kind is EntryKind.DIRECTORY and name not in SKIPPED_DIRS:
                    stack.append((posixpath.join(directory, name), relative))
            for name, child in reversed(children):
                relative = f"{prefix}/{name}" if prefix else name
                if child.kind is not EntryKind.FILE or child.size > SEARCH_FILE_BYTES:
                    continue
                if not glob or fnmatchcase(relative, glob) or fnmatchcase(name, glob):
                    yield relative, posixpath.join(directory, name), child.size

    # -- writing --------------------------------------------------------------------------------------

    async def write(self, workspace_id: str, path: str, content: str, request_id: str) -> Written:
        name = relative_path(path, "path")
        data = content.encode(errors="surrogateescape")
        if len(data) > MAX_FILE_BYTES:
            raise _invalid("content", f"at most {MAX_FILE_BYTES} bytes")
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
            raise _invalid("patch", "required: a unified diff")
        if len(text.encode(errors="surrogateescape")) > MAX_PATCH_BYTES:
            raise _invalid("patch", f"at most {MAX_PATCH_BYTES} bytes")
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
            raise _invalid("patch", str(error)) from None
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
        output = await backend.git(
            git.argv(record.root, *args, options=options), git.environment(record.root), max_output=max_output
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
                    raise _invalid("branch", f"{branch!r} is not a valid git branch name")
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

    async def diff(self, workspace_id: str, base: str, target: str, max_bytes: int) -> Diff:
        if base:
            git.check_revision(base, "base")
        if target:
            git.check_revision(target, "target")
        cap = _bounded(max_bytes, "max_bytes", default=DEFAULT_DIFF_BYTES, maximum=MAX_DIFF_BYTES)
        record, backend = await self._workspace(workspace_id)
        await self._repository(record, backend)
        base_commit = await self._commit_of(record, backend, base or "HEAD", "base")
        target_commit = await self._commit_of(record, backend, target, "target") if target else ""
        compared = (base_commit, target_commit) if target_commit else (base_commit,)
        output = await self._git(record, backend, "diff", *git.DIFF_OPTIONS, *compared, "--", max_output=cap)
        untracked: list[str] = []
        if not target:
            listing = await self._git(record, backend, "ls-files", "--others", "--exclude-standard", "-z")
            untracked = git.nul_separated(listing.stdout, truncated=listing.truncated)[:MAX_UNTRACKED_SHOWN]
        text = output.stdout.decode(errors="replace")
        return Diff(text, output.truncated, base_commit, target_commit, untracked)

    async def commit(self, workspace_id: str, message: str, request_id: str) -> Commit:
        git.check_message(message)
        check_request_id(request_id)
        record, backend = await self._workspace(workspace_id)

        async def commit() -> Commit:
            async with self._lock(record):
                state = await self._repository(record, backend)
                if not state.dirty:
                    return Commit(state.head_commit, committed=False)
                await self._git(record, backend, "add", "-A")
                staged = await self._git(record, backend, "diff", "--cached", "--quiet", check=False)
                if staged.status == 0:
                    return Commit(state.head_commit, committed=False)
                await self._git(record, backend, "commit", "-q", "-m", message, options=git.IDENTITY)
                return Commit(await self._commit_of(record, backend, "HEAD", "HEAD"), committed=True)

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
