"""Job domain types shared by local, SSH and Slurm jobs."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class JobState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    EXITED = "exited"
    UNKNOWN = "unknown"
    NOT_FOUND = "not_found"

    @property
    def ended(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


@dataclass(frozen=True)
class JobObservation:
    """One look at a job: its state, exit code when known, and why."""

    state: JobState
    exit_code: int | None = None
    detail: str = ""
    new_log_lines: tuple[str, ...] = field(default=())
