"""The monitor's request rules: each check raises InvalidArgument naming the request field at fault."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from monitor_svc.gpus import GpuRequest
from quarry.errors import FieldViolation, InvalidArgument
from quarry.vocabulary import JobRef

MAX_PID = 2**31 - 1
MAX_INTERVAL_SECONDS = 3600.0
DEFAULT_TAIL_LINES = 20
MAX_TAIL_LINES = 500
MAX_ARGS = 4096
MAX_COMMAND_CHARS = 256 * 1024  # all arguments, or the command line, together
MAX_ENVIRONMENT = 256
MAX_ENVIRONMENT_CHARS = 256 * 1024  # names and values together
MAX_WALL_CLOCK_SECONDS = 30 * 24 * 3600.0
MAX_GPUS = 64
MAX_GPU_INDEX = 1023
MAX_JOB_ID_CHARS = 64
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")


def _invalid(field: str, description: str) -> InvalidArgument:
    return InvalidArgument([FieldViolation(field, description)])


def refuse_nul(fields: Mapping[str, str]) -> None:
    """Refuse NUL in text that becomes a path, an argument or a command: the OS cannot take it, and a
    shell on a remote host would cut the text short there."""
    violations = [
        FieldViolation(field, "must not contain NUL characters") for field, value in fields.items() if "\x00" in value
    ]
    if violations:
        raise InvalidArgument(violations)


def require_job_kind(kind: str | None, allowed: Sequence[str]) -> str:
    """The kind of job a request names, which must be one of `allowed`."""
    if kind is None or kind not in allowed:
        raise _invalid("job", f"one of {', '.join(allowed[:-1])} or {allowed[-1]}")
    return kind


def interval_seconds(seconds: float | None, field: str, *, default: float, minimum: float) -> float:
    """A requested interval (None: not given, so the default), between `minimum` and an hour."""
    if seconds is None:
        return default
    if not minimum <= seconds <= MAX_INTERVAL_SECONDS:
        raise _invalid(field, f"between {minimum:g} s and 1 hour")
    return seconds


def tail_lines(requested: int) -> int:
    """How many log lines the first status carries (0: the default)."""
    if not 0 <= requested <= MAX_TAIL_LINES:
        raise _invalid("log_tail_lines", f"between 0 and {MAX_TAIL_LINES}")
    return requested or DEFAULT_TAIL_LINES


def command_argv(argv: Sequence[str], command_line: str, prefix: str) -> tuple[str, ...]:
    """The program and its arguments: `argv`, or `command_line` split as a POSIX shell would (never run by one)."""
    refuse_nul(
        {**{f"{prefix}.argv[{index}]": arg for index, arg in enumerate(argv)}, f"{prefix}.command_line": command_line}
    )
    if argv and command_line:
        raise _invalid(f"{prefix}.command_line", "either argv or command_line, not both")
    if len(command_line) > MAX_COMMAND_CHARS or sum(map(len, argv)) > MAX_COMMAND_CHARS:
        raise _invalid(f"{prefix}.argv", f"at most {MAX_COMMAND_CHARS} characters in all")
    if command_line:
        try:
            argv = shlex.split(command_line)
        except ValueError as error:  # an unclosed quote, a trailing backslash
            raise _invalid(f"{prefix}.command_line", f"cannot be split into arguments: {error}") from None
        if not argv:
            raise _invalid(f"{prefix}.command_line", "names no program")
    if not argv:
        raise _invalid(f"{prefix}.argv", "required: the program and its arguments (or command_line)")
    if len(argv) > MAX_ARGS:
        raise _invalid(f"{prefix}.argv", f"at most {MAX_ARGS} arguments")
    return tuple(argv)


def check_environment(environment: Mapping[str, str]) -> None:
    """Variable names are identifiers (so they can be exported on a host as they are); values hold no NUL."""
    field = "options.environment"
    if len(environment) > MAX_ENVIRONMENT:
        raise _invalid(field, f"at most {MAX_ENVIRONMENT} variables")
    if sum(len(name) + len(value) for name, value in environment.items()) > MAX_ENVIRONMENT_CHARS:
        raise _invalid(field, f"at most {MAX_ENVIRONMENT_CHARS} characters in all")
    violations = []
    for name, value in environment.items():
        shown = repr(name[:64])
        if not _VARIABLE.fullmatch(name):
            violations.append(FieldViolation(field, f"{shown} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"))
        elif "\x00" in value:
            violations.append(FieldViolation(field, f"the value of {shown} must not contain NUL characters"))
    if violations:
        raise InvalidArgument(violations)


def wall_clock_limit(seconds: float | None) -> float | None:
    if seconds is not None and not 0 < seconds <= MAX_WALL_CLOCK_SECONDS:
        raise _invalid("options.wall_clock_limit", "more than 0 s and at most 30 days")
    return seconds


def check_gpu_request(request: GpuRequest) -> None:
    field = "options.gpus"
    if request.count and request.indices:
        raise _invalid(f"{field}.indices", "either a count or indices, not both")
    if not 0 <= request.count <= MAX_GPUS:
        raise _invalid(f"{field}.count", f"between 0 and {MAX_GPUS}")
    if len(request.indices) > MAX_GPUS or len(set(request.indices)) != len(request.indices):
        raise _invalid(f"{field}.indices", f"at most {MAX_GPUS} different indices")
    if any(not 0 <= index <= MAX_GPU_INDEX for index in request.indices):
        raise _invalid(f"{field}.indices", f"between 0 and {MAX_GPU_INDEX}")


def check_monitor_job_id(ref: JobRef) -> None:
    refuse_nul({"job.monitor_job_id": ref.monitor_job_id, "job.log_path": ref.log_path})
    if len(ref.monitor_job_id) > MAX_JOB_ID_CHARS:
        raise _invalid("job.monitor_job_id", f"at most {MAX_JOB_ID_CHARS} characters")
