"""The workspace operations that change nothing: describe, find a job's path, list, read, search, diff.

Reads do not wait for the changes to a workspace (writes.py) that run one at a time.
"""

from __future__ import annotations

import posixpath
import re
from collections import deque
from collections.abc import AsyncIterator
from fnmatch import fnmatchcase

from monitor_svc.validation import refuse_nul
from monitor_svc.workspaces import git
from monitor_svc.workspaces.access import WorkspaceAccess, invalid, wrong_kind
from monitor_svc.workspaces.backend import Backend
from monitor_svc.workspaces.grep import SearchTooSlow, search
from monitor_svc.workspaces.patch import split_lines
from monitor_svc.workspaces.paths import MAX_PATH_CHARS, SKIPPED_DIRS, relative_path
from monitor_svc.workspaces.registry import check_workspace_id
from monitor_svc.workspaces.types import (
    Diff,
    EntryKind,
    FileInfo,
    FileText,
    SearchMatch,
    SearchResult,
    Tree,
    TreeEntry,
    Workspace,
    WorkspaceRecord,
)
from quarry.errors import ErrorReason, FailedPrecondition, NotFound

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
MAX_UNTRACKED_SHOWN = 1000


def _bounded(value: int, field: str, *, default: int, maximum: int) -> int:
    if not 0 <= value <= maximum:
        raise invalid(field, f"between 0 (the default, {default}) and {maximum}")
    return value or default


class WorkspaceReads(WorkspaceAccess):
    async def get(self, workspace_id: str) -> Workspace:
        record, backend = await self._workspace(workspace_id)
        return await self._describe(record, backend)

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
            raise wrong_kind(name, "a directory" if directory else "a regular file")
        return record, resolved

    async def tree(self, workspace_id: str, path: str, max_depth: int, max_entries: int) -> Tree:
        depth = _bounded(max_depth, "max_depth", default=DEFAULT_DEPTH, maximum=MAX_DEPTH)
        limit = _bounded(max_entries, "max_entries", default=DEFAULT_ENTRIES, maximum=MAX_ENTRIES)
        start = relative_path(path, "path", allow_root=True)
        record, backend = await self._workspace(workspace_id)
        resolved, info = await self._existing(record, backend, start)
        if info.kind is not EntryKind.DIRECTORY:
            raise wrong_kind(start, "a directory")
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
            raise invalid("start_line", "from 1 (0: the first line)")
        if end_line < 0 or (end_line and end_line < max(start_line, 1)):
            raise invalid("end_line", "0 (the end of the file) or at least start_line")
        cap = _bounded(max_bytes, "max_bytes", default=DEFAULT_READ_BYTES, maximum=MAX_READ_BYTES)
        first = start_line or 1
        record, backend = await self._workspace(workspace_id)
        resolved, info = await self._existing(record, backend, name)
        if info.kind is not EntryKind.FILE:
            raise wrong_kind(name, "a regular file")
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
            raise invalid("pattern", f"required: a regular expression of at most {MAX_PATTERN_CHARS} characters")
        flags = re.IGNORECASE if case_insensitive else 0
        try:
            re.compile(pattern, flags)
        except (re.error, OverflowError, RecursionError, ValueError) as error:
            raise invalid("pattern", f"not a valid Python regular expression: {error}") from None
        refuse_nul({"glob": glob})
        if len(glob) > MAX_PATH_CHARS:
            raise invalid("glob", f"at most {MAX_PATH_CHARS} characters")
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
            raise wrong_kind(start, "a file or a directory")
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
