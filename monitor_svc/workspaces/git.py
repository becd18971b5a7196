"""Git in a workspace, as pure pieces: the argument vectors the monitor runs and the output it reads.

Every git command runs in the workspace root, as an argument vector (never through a local shell;
over SSH every word is quoted), never prompting, and looking for the repository at the root only
(GIT_CEILING_DIRECTORIES): a root inside another repository's working tree is not a repository,
so a commit or a reset never reaches files outside the root; nor can the repository's
core.worktree move its work tree elsewhere.

Git in a workspace runs nothing the workspace names. A job may write the repository's
configuration, so: no system or global configuration is read (backend.GIT_ENV); hooks, fsmonitor,
pagers, editors, password prompts, signing and automatic gc are off by the options every command
gets; and before each command the repository's own configuration, with every file it includes, is
listed (`git config --list`, which runs nothing) and each key naming a command (a filter, a
textconv or external diff, a merge driver, an SSH command, a credential helper, ...) is overridden
on the command line, which beats the repository's configuration: an empty command is none, a flag
is off. Without its filters git would store or check out other content than the repository means
(Git LFS pointers, say), so a command that writes (add, commit, checkout, reset, clean) is refused
where a filter is configured; reading (status, diff) goes on without it.
"""

from __future__ import annotations

import posixpath

from monitor_svc.workspaces.backend import GIT_ENV
from monitor_svc.workspaces.types import GitState
from quarry.errors import ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument

_SETTINGS = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=",
    "core.editor=:",
    "sequence.editor=:",
    "core.askPass=",
    "core.sshCommand=",
    "core.gitProxy=",
    "core.alternateRefsCommand=",
    "credential.helper=",
    "diff.external=",
    "gpg.program=",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "log.showSignature=false",
    "uploadpack.packObjectsHook=",
    "submodule.recurse=false",  # a submodule's own configuration is not listed: git never goes into one
    "diff.ignoreSubmodules=all",
    "gc.auto=0",
    "maintenance.auto=false",
)
_OPTIONS = ("--no-pager", *(word for setting in _SETTINGS for word in ("-c", setting)))
# The repository's configuration with what it includes: key names only, never a value, and nothing run.
CONFIG_LISTING = ("config", "--includes", "--name-only", "-z", "--list")
# Variables whose value is a command git runs, by their last part (in any section), and what turns each off.
_COMMAND_VARIABLES = {
    name: ""
    for name in (
        "clean",
        "smudge",
        "process",
        "textconv",
        "command",
        "external",
        "driver",
        "program",
        "cmd",
        "helper",
        "askpass",
        "sshcommand",
        "gitproxy",
        "alternaterefscommand",
        "packobjectshook",
        "pager",
    )
} | {"editor": ":", "hookspath": "/dev/null", "fsmonitor": "false", "gpgsign": "false", "required": "false"}
_FILTER_COMMANDS = ("clean", "smudge", "process")
WRITING_COMMANDS = frozenset({"add", "commit", "checkout", "reset", "clean"})
# Commits the monitor makes are Quarry's, whoever the host's git user is.
IDENTITY = ("-c", "user.name=Quarry", "-c", "user.email=quarry@localhost")
MAX_REVISION_CHARS = 256
MAX_BRANCH_CHARS = 200
MAX_MESSAGE_CHARS = 16 * 1024
# Read-only diffs: no external diff program or text conversion filter runs.
DIFF_OPTIONS = ("--no-color", "--no-ext-diff", "--no-textconv", "--no-renames")
QUIET_DIFF_OPTIONS = ("--no-ext-diff", "--no-textconv")


def argv(root: str, *args: str, options: tuple[str, ...] = ()) -> list[str]:
    return ["-C", root, *_OPTIONS, "-c", f"core.worktree={root}", *options, *args]


def overrides(listing: bytes, command: str) -> tuple[str, ...]:
    """The `-c` options that turn off every command the repository's configuration (CONFIG_LISTING's output)
    names; FAILED_PRECONDITION naming the key where that cannot be done, or where `command` writes and a
    filter is configured."""
    options: list[str] = []
    for key in nul_separated(listing):
        section, _, rest = key.partition(".")
        subsection, _, name = rest.rpartition(".")
        neutral = _COMMAND_VARIABLES.get(name.lower())
        if neutral is None or (name.lower() == "required" and section.lower() != "filter"):
            continue
        if "=" in key or "\n" in key:  # `-c` reads the key up to the first "="
            raise _refused(key, "its name cannot be overridden on git's command line")
        filtering = section.lower() == "filter" and subsection and name.lower() in _FILTER_COMMANDS
        if filtering and command in WRITING_COMMANDS:
            raise _refused(key, f"without the filter, git {command} would write other content than it means")
        options += ["-c", f"{key}={neutral}"]
    return tuple(options)


def _refused(key: str, why: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"the workspace's git configuration sets {key!r}, a command the monitor never runs: {why}",
        reason=ErrorReason.WORKSPACE_GIT_FAILED,
        metadata={"key": key[:200]},
    )


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
