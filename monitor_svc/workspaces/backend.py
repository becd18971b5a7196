"""What the workspace operations need of a host: a few file-system calls and git, on absolute paths.

The operations themselves (path checks, tree walks, search, patching, git) are written once over
this protocol, so a workspace on this machine and one over SSH behave the same by construction.
Paths given to a backend have already been resolved and checked inside the workspace root.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping, Sequence
from typing import Protocol

from monitor_svc.workspaces.types import EntryKind, FileInfo, GitOutput
from quarry.errors import ErrorReason, FailedPrecondition

# Where git looks for a repository: at the root only (GIT_CEILING_DIRECTORIES, set per workspace),
# never prompting; messages in English, which the git module reads. No system or global configuration
# (nor attributes) is read, so only the repository's, which git.overrides disarms, and the command line's.
GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "",
    "GIT_PAGER": "",
    "GIT_EDITOR": ":",
    "GIT_SEQUENCE_EDITOR": ":",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "HOME": "/nonexistent",  # no ~/.gitconfig, for a git older than GIT_CONFIG_GLOBAL
    "XDG_CONFIG_HOME": "/nonexistent",
    "LC_ALL": "C",
}
MAX_GIT_STDERR = 64 * 1024


class Backend(Protocol):
    @property
    def host(self) -> str: ...

    async def lstat(self, path: str) -> FileInfo | None:
        """The path's own metadata; None when it does not exist."""

    async def realpath(self, path: str) -> str:
        """The path with every symbolic link resolved (missing components kept as written)."""

    async def listdir(self, path: str) -> list[tuple[str, FileInfo]]:
        """A directory's entries (names, their own metadata), without "." and ".."."""

    async def read(self, path: str, limit: int) -> tuple[bytes, int]:
        """A regular file's first `limit` bytes and its size."""

    async def write(self, path: str, data: bytes, mode: int | None) -> None:
        """Replace (or create) a file atomically: a temporary file in its directory, renamed over it."""

    async def makedirs(self, path: str) -> None:
        """Create the directory and its missing parents."""

    async def remove(self, path: str) -> None:
        """Delete a file."""

    async def git(self, args: Sequence[str], env: Mapping[str, str], *, max_output: int) -> GitOutput:
        """Run `git ARGS` (an argument vector, never a shell line) under the git timeout."""


def kind_of(mode: int) -> EntryKind:
    if stat.S_ISREG(mode):
        return EntryKind.FILE
    if stat.S_ISDIR(mode):
        return EntryKind.DIRECTORY
    if stat.S_ISLNK(mode):
        return EntryKind.SYMLINK
    return EntryKind.OTHER


def info_of(mode: int, size: int) -> FileInfo:
    kind = kind_of(mode)
    return FileInfo(kind, size if kind is EntryKind.FILE else 0, stat.S_IMODE(mode))


def cannot(verb: str, path: str, host: str, why: str) -> FailedPrecondition:
    return FailedPrecondition(f"cannot {verb} {path} on {host}: {why}")


def not_a_file(path: str, what: str) -> FailedPrecondition:
    return FailedPrecondition(f"{path} is {what}, not a regular file", reason=ErrorReason.WORKSPACE_WRONG_KIND)
