"""Job domain types shared by local, SSH and Slurm jobs (JobState and JobRef are the kernel's vocabulary)."""

from __future__ import annotations

from dataclasses import dataclass, field

from quarry.vocabulary import JobState


@dataclass(frozen=True)
class JobObservation:
    """One look at a job: its state, exit code when known, and why."""

    state: JobState
    exit_code: int | None = None
    detail: str = ""
    new_log_lines: tuple[str, ...] = field(default=())
