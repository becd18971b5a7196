"""Git in a workspace, as pure pieces: the argument vectors the monitor runs and the output it reads.

Every git command runs in the workspace root, as an argument vector (never through a local shell;
over SSH every word is quoted), with hooks off (core.hooksPath=/dev/null), no fsmonitor and no
signing, never prompting, and looking for the repository at the root only
(GIT_CEILING_DIRECTORIES): a root inside another repository's working tree is not a repository,
so a commit or a reset never reaches files outside the root.
"""

from __future__ import annotations

import posixpath

from monitor_svc.workspaces.backend import GIT_ENV
from monitor_svc.workspaces.types import GitState
from quarry.errors import FieldViolation, InvalidArgument

_OPTIONS = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "commit.gpgsign=false")
# Commits the monitor makes are Quarry's, whoever the host's git user is.
IDENTITY = ("-c", "user.name=Quarry", "-c", "user.email=quarry@localhost")
MAX_REVISION_CHARS = 256
MAX_BRANCH_CHARS = 200
MAX_MESSAGE_CHARS = 16 * 1024
# Read-only diffs: no external diff program or text conversion filter runs.
DIFF_OPTIONS = ("--no-color", "--no-ext-diff", "--no-textconv", "--no-renames")


def argv(root: str, *args: str, options: tuple[str, ...] = ()) -> list[str]:
    return ["-C", root, *_OPTIONS, *options, *args]


def environment(root: str) -> dict[str, str]:
    parent = posixpath.dirname(root)
    return {**GIT_ENV, "GIT_CEILING_DIRECTORIES": parent} if parent != root else dict(GIT_ENV)


def nul_separated(output: bytes, *, truncated: bool = False) -> list[str]:
    """Fields of a `-z` listing (the last one dropped if the output was cut inside it)."""
    fields = output.decode(errors="surrogateescape").split("\x00")
    if fields and (fields[-1] == "" or truncated):
        fields.pop()
    return [field for field in fields if field]


def parse_status(output: bytes, *, truncated: bool = False) -> GitState:
    """`git status --porcelain=v2 --branch -z`: the branch headers, then one record per change."""
    head = branch = ""
    dirty = truncated  # cut short: there was at least a lot to say
    for record in nul_separated(output, truncated=truncated):
        if record.startswith("# branch.oid "):
            oid = record.removeprefix("# branch.oid ")
            head = "" if oid == "(initial)" else oid
        elif record.startswith("# branch.head "):
            name = record.removeprefix("# branch.head ")
            branch = "" if name == "(detached)" else name
        elif not record.startswith("#"):
            dirty = True
    return GitState(is_repo=True, head_commit=head, branch=branch, dirty=dirty)


def not_a_repository(stderr: str) -> bool:
    return "not a git repository" in stderr.lower()


def _invalid(field: str, description: str) -> InvalidArgument:
    return InvalidArgument([FieldViolation(field, description)])


def check_revision(value: str, field: str) -> str:
    """A commit-ish as a request names it (a hash, branch or tag); git decides whether it exists."""
    if not value:
        raise _invalid(field, "required: a commit hash, a branch or a tag")
    if "\x00" in value or len(value) > MAX_REVISION_CHARS:
        raise _invalid(field, f"a revision of at most {MAX_REVISION_CHARS} characters, without NUL")
    if value.startswith("-") or any(char.isspace() for char in value):
        raise _invalid(field, "a revision, not an option: no leading '-' and no spaces")
    return value


def check_branch(value: str, field: str = "branch") -> str:
    """The plain shape of a new branch name; git's check-ref-format has the last word."""
    if not value:
        raise _invalid(field, "required: the new branch's name")
    if "\x00" in value or len(value) > MAX_BRANCH_CHARS:
        raise _invalid(field, f"a branch name of at most {MAX_BRANCH_CHARS} characters, without NUL")
    if value.startswith("-") or "@{" in value:
        raise _invalid(field, "a branch name: no leading '-' and no '@{'")
    return value


def check_message(value: str, field: str = "message") -> str:
    if not value.strip():
        raise _invalid(field, "required: the commit message")
    if "\x00" in value or len(value) > MAX_MESSAGE_CHARS:
        raise _invalid(field, f"at most {MAX_MESSAGE_CHARS} characters, without NUL")
    return value
