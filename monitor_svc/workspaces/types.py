"""Workspace domain types: the durable record, what a host's file system reports, and each operation's answer."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

LOCAL = "local"


@dataclass(frozen=True)
class WorkspaceRecord:
    """What the monitor keeps of an open workspace (its JSON file), and what jobs resolve an id to."""

    workspace_id: str
    host: str  # LOCAL or a configured SSH host
    root: str  # absolute, resolved on its host
    protected_paths: tuple[str, ...]
    # The configured workspace root it was opened under: the workspace stays usable while that is configured.
    allowed_root: str


class EntryKind(enum.Enum):
    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    OTHER = "other"


@dataclass(frozen=True)
class FileInfo:
    """A path's own metadata (symbolic links not followed)."""

    kind: EntryKind
    size: int
    mode: int  # permission bits


@dataclass(frozen=True)
class GitState:
    is_repo: bool
    head_commit: str = ""
    branch: str = ""
    dirty: bool = False


@dataclass(frozen=True)
class Workspace:
    record: WorkspaceRecord
    git: GitState


@dataclass(frozen=True)
class TreeEntry:
    path: str
    kind: EntryKind
    size: int
    children_omitted: bool = False


@dataclass(frozen=True)
class Tree:
    entries: list[TreeEntry]
    truncated: bool


@dataclass(frozen=True)
class FileText:
    content: str
    start_line: int
    end_line: int
    size: int
    truncated: bool
    binary: bool = False


@dataclass(frozen=True)
class SearchMatch:
    path: str
    line_number: int
    line: str


@dataclass(frozen=True)
class SearchResult:
    matches: list[SearchMatch]
    truncated: bool
    files_scanned: int
    bytes_scanned: int


@dataclass(frozen=True)
class Written:
    size: int
    created: bool


@dataclass(frozen=True)
class Patched:
    modified: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Diff:
    text: str
    truncated: bool
    base_commit: str
    target_commit: str
    untracked: list[str]


@dataclass(frozen=True)
class Commit:
    commit: str
    committed: bool
    changed_paths: tuple[str, ...] = ()  # what the commit changed, relative to the root
    changed_paths_truncated: bool = False


@dataclass(frozen=True)
class GitOutput:
    """A git command's result: stdout up to a limit (truncated says it was cut), stderr's text."""

    status: int
    stdout: bytes
    stderr: str
    truncated: bool = False
