"""Slurm job states from `sacct` (the authority) and `squeue` (the fallback), parsed strictly."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from monitor_svc.smi import MalformedOutput
from quarry.vocabulary import JobState

_JOB_ID = re.compile(r"\d+(_\d+)?")


# Slurm's states (sacct and squeue spell them the same), by what they mean for a watcher.
_STATES = {
    "PENDING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "CONFIGURING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "PREEMPTED": JobState.FAILED,
    "REVOKED": JobState.CANCELLED,
    "SPECIAL_EXIT": JobState.FAILED,
    "TIMEOUT": JobState.TIMED_OUT,
    "CANCELLED": JobState.CANCELLED,
}

SACCT_FORMAT = "JobID,State,ExitCode,Timelimit"


@dataclass(frozen=True)
class SlurmObservation:
    state: JobState
    exit_code: int | None = None
    detail: str = ""
    time_limit_seconds: float | None = None


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"{job_id!r} is not a Slurm job id")
    return job_id


def sacct_command(job_id: str) -> str:
    return f"sacct -j {check_job_id(job_id)} --format={SACCT_FORMAT} --parsable2 --noheader"


def squeue_command(job_id: str) -> str:
    return f"squeue -j {check_job_id(job_id)} --noheader --format=%T"


def _state(word: str, line: str) -> JobState:
    # sacct writes e.g. "CANCELLED by 1000"; a trailing "+" marks a truncated name.
    name = word.split()[0].rstrip("+") if word.strip() else ""
    if name not in _STATES:
        raise MalformedOutput(f"unknown Slurm state {word!r} in line {line!r}")
    return _STATES[name]


def parse_time_limit(text: str) -> float | None:
    """Slurm's [days-]hours:minutes:seconds (or minutes, or mm:ss); None for UNLIMITED or blank."""
    value = text.strip()
    if not value or value.upper() in ("UNLIMITED", "PARTITION_LIMIT", "INVALID"):
        return None
    days = 0
    if "-" in value:
        day_text, value = value.split("-", 1)
        days = int(day_text)
    parts = [int(part) for part in value.split(":")]
    if len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = parts[-3:]
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def format_time_limit(seconds: float) -> str:
    """A --time value: days-hours:minutes:seconds, whole seconds rounded up."""
    days, rest = divmod(math.ceil(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, whole = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{whole:02d}"


def parse_sacct(output: str, job_id: str) -> SlurmObservation | None:
    """The job's own line (not its .batch/.extern steps); None when sacct does not list it (yet)."""
    for line in output.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != 4:
            raise MalformedOutput(f"expected {SACCT_FORMAT} separated by '|', got {line!r}")
        found_id, state_text, exit_text, limit_text = fields
        if found_id != job_id:
            continue
        state = _state(state_text, line)
        code_text, _, signal_text = exit_text.partition(":")
        if not code_text.isdigit() or not signal_text.isdigit():
            raise MalformedOutput(f"ExitCode is {exit_text!r}, not CODE:SIGNAL, in line {line!r}")
        code, signal = int(code_text), int(signal_text)
        detail = f"Slurm state {state_text}"
        exit_code: int | None = None
        if signal:
            detail += f", killed by signal {signal}"
            exit_code = 128 + signal  # as a shell reports a signal
        elif code or state in (JobState.COMPLETED, JobState.FAILED):
            exit_code = code  # a timed-out or cancelled job's 0 says nothing, so it is left unset
        if not state.ended:
            exit_code = None
        if state is JobState.COMPLETED and (code or signal):
            state = JobState.FAILED  # Slurm can say COMPLETED for a step that exited non-zero
        try:
            limit = parse_time_limit(limit_text)
        except ValueError:
            raise MalformedOutput(f"Timelimit is {limit_text!r} in line {line!r}") from None
        return SlurmObservation(state, exit_code, detail, limit)
    return None


def parse_squeue(output: str) -> SlurmObservation | None:
    """squeue lists only jobs still in the queue: its state, or None when the job is not there.

    An array job lists one line per task: it runs while any task runs, else waits while any waits.
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return None
    states = [_state(line, line) for line in lines]
    for wanted in (JobState.RUNNING, JobState.PENDING):
        if wanted in states:
            return SlurmObservation(
                wanted, detail=f"Slurm state {wanted.value.upper()} (from squeue, {len(lines)} line(s))"
            )
    return SlurmObservation(states[0], detail=f"Slurm state {lines[0]} (from squeue)")


def parse_sbatch(output: str) -> str:
    """`sbatch --parsable` prints "JOBID" or "JOBID;CLUSTER"."""
    text = output.strip().split(";", 1)[0]
    if not _JOB_ID.fullmatch(text):
        raise MalformedOutput(f"sbatch --parsable printed {output.strip()!r}, not a job id")
    return text
