"""The monitor's request rules: each check raises InvalidArgument naming the request field at fault."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from monitor_svc.slurm import check_job_id
from quarry.errors import FieldViolation, InvalidArgument
from quarry.vocabulary import JobRef

MAX_PID = 2**31 - 1
MAX_INTERVAL_SECONDS = 3600.0
DEFAULT_TAIL_LINES = 20
MAX_TAIL_LINES = 500
JOB_KINDS = ("local", "remote", "slurm")


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


def check_job_ref(ref: JobRef) -> JobRef:
    """A job reference a watch can follow: a process id, or a Slurm job id, and the host where needed."""
    require_job_kind(ref.kind, JOB_KINDS)
    prefix = f"job.{ref.kind}"
    refuse_nul({"job.log_path": ref.log_path, f"{prefix}.host": ref.host, f"{prefix}.job_id": ref.job_id})
    if ref.kind == "slurm":
        try:
            check_job_id(ref.job_id)
        except ValueError as error:
            raise _invalid(f"{prefix}.job_id", str(error)) from None
        if not ref.host:
            raise _invalid(f"{prefix}.host", "required: the login host sacct runs on")
        return ref
    violations = []
    if not 0 < ref.pid <= MAX_PID:
        violations.append(FieldViolation(f"{prefix}.pid", "a process id"))
    if ref.kind == "remote" and not ref.host:
        violations.append(FieldViolation(f"{prefix}.host", "required: a configured host"))
    if violations:
        raise InvalidArgument(violations)
    return ref


def tail_lines(requested: int) -> int:
    """How many log lines the first status carries (0: the default)."""
    if not 0 <= requested <= MAX_TAIL_LINES:
        raise _invalid("log_tail_lines", f"between 0 and {MAX_TAIL_LINES}")
    return requested or DEFAULT_TAIL_LINES
