"""Path rules of a workspace, as pure functions: what a request may name, what is protected, what is inside.

A request names paths relative to the workspace root, "/"-separated, without ".." and never
absolute. Where a path really leads is decided by resolving it on its host (symbolic links
followed, `realpath` below) right before it is used; a result outside the root is refused.
Protected paths are rules given when the workspace is opened: a file, a directory (everything
under it), or a glob. Git's own `.git` directory is always protected: a file written there (a
hook, a config setting a filter or an fsmonitor command) would make git run code.
"""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Awaitable, Callable, Sequence
from fnmatch import fnmatchcase

from quarry.errors import ErrorReason, FieldViolation, InvalidArgument

MAX_PATH_CHARS = 4096
MAX_PROTECTED_PATHS = 64
GIT_DIR = ".git"
# Directories a tree listing does not enter and a search does not read: tools' and caches' own.
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        "node_modules",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".ipynb_checkpoints",
    }
)
_MAX_SYMLINKS = 40  # as Linux allows in one lookup


def _invalid(field: str, description: str, reason: ErrorReason | None = None) -> InvalidArgument:
    return InvalidArgument([FieldViolation(field, description)], reason=reason)


def relative_path(value: str, field: str, *, allow_root: bool = False) -> str:
    """The request's path in normal form ("a/b", "" for the root), or INVALID_ARGUMENT naming the field."""
    if "\x00" in value:
        raise _invalid(field, "must not contain NUL characters")
    if len(value) > MAX_PATH_CHARS:
        raise _invalid(field, f"at most {MAX_PATH_CHARS} characters")
    if value.startswith("/"):
        escapes = ErrorReason.WORKSPACE_PATH_ESCAPES
        raise _invalid(field, "a path relative to the workspace root, not an absolute one", escapes)
    parts = [part for part in value.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise _invalid(field, "must not contain '..' components", ErrorReason.WORKSPACE_PATH_ESCAPES)
    if not parts and not allow_root:
        raise _invalid(field, "required: a file relative to the workspace root")
    return "/".join(parts)


def protected_rules(values: Sequence[str], field: str = "protected_paths") -> tuple[str, ...]:
    """Protected-path rules in normal form, sorted and without repeats."""
    if len(values) > MAX_PROTECTED_PATHS:
        raise _invalid(field, f"at most {MAX_PROTECTED_PATHS} paths")
    rules = set()
    for index, value in enumerate(values):
        rule = relative_path(value, f"{field}[{index}]", allow_root=True)
        if not rule:
            raise _invalid(f"{field}[{index}]", "a path under the root (protecting the root leaves nothing to edit)")
        rules.add(rule)
    return tuple(sorted(rules))


def protecting_rule(path: str, rules: Sequence[str]) -> str | None:
    """The rule that makes `path` (normal form) read-only, or None.

    A rule protects a path equal to it or matching it as a glob (fnmatch, case-sensitive, where
    `*` also matches "/"), and everything under such a path.
    """
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        if parts[depth - 1].casefold() == GIT_DIR:
            return GIT_DIR
        prefix = "/".join(parts[:depth])
        for rule in rules:
            if prefix == rule or fnmatchcase(prefix, rule):
                return rule
    return None


def within(path: str, root: str) -> bool:
    """`path` is `root` or under it (both absolute and normal)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def relative_to(path: str, root: str) -> str:
    """`path` (inside `root`) relative to it; "" for the root."""
    return "" if path == root else path[len(root.rstrip("/")) + 1 :]


LstatMode = Callable[[str], Awaitable[int | None]]
ReadLink = Callable[[str], Awaitable[str]]


async def realpath(path: str, lstat_mode: LstatMode, readlink: ReadLink) -> str:
    """`os.path.realpath` of an absolute path, over a host's lstat (its st_mode; None: missing) and readlink.

    The same algorithm as Python's posixpath (non-strict): symbolic links are followed, missing
    components are kept as written, and a loop leaves the rest unresolved (opening it then fails).
    """
    resolved, _ = await _join(posixpath.sep, path, lstat_mode, readlink, {}, [0])
    return resolved


async def _join(
    path: str, rest: str, lstat_mode: LstatMode, readlink: ReadLink, seen: dict[str, str | None], links: list[int]
) -> tuple[str, bool]:
    if rest.startswith(posixpath.sep):
        rest, path = rest[1:], posixpath.sep
    while rest:
        name, _, rest = rest.partition(posixpath.sep)
        if not name or name == posixpath.curdir:
            continue
        if name == posixpath.pardir:
            path = posixpath.dirname(path) if path != posixpath.sep else path
            continue
        candidate = posixpath.join(path, name)
        mode = await lstat_mode(candidate)
        if mode is None or not stat.S_ISLNK(mode):
            path = candidate
            continue
        if candidate in seen:
            known = seen[candidate]
            if known is not None:
                path = known
                continue
            return posixpath.join(candidate, rest), False  # a loop
        links[0] += 1
        if links[0] > _MAX_SYMLINKS:
            return posixpath.join(candidate, rest), False
        seen[candidate] = None
        path, complete = await _join(path, await readlink(candidate), lstat_mode, readlink, seen, links)
        if not complete:
            return posixpath.join(path, rest), False
        seen[candidate] = path
    return path, True
