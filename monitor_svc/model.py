"""Job domain types shared by local, SSH and Slurm jobs (JobState and JobRef are the kernel's vocabulary)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from quarry.vocabulary import JobState, MetricDirection


@dataclass(frozen=True)
class MetricSpec:
    """A number a job reports: from a pattern over its log lines, or a key of a JSON-lines file it writes."""

    name: str
    direction: MetricDirection | None  # None: not given (refused at submission)
    log_regex: str = ""
    jsonl_path: str = ""  # relative to the job's working directory
    jsonl_key: str = ""


@dataclass(frozen=True)
class MetricPoint:
    """One value as it appeared in the log: `step` is its line number (from 1)."""

    name: str
    value: float
    step: int


@dataclass(frozen=True)
class MetricResult:
    """A metric once its job has ended: the last value, the best by its direction, and how many were read."""

    name: str
    direction: MetricDirection
    value: float | None = None  # None: not found
    best: float | None = None
    count: int = 0
    detail: str = ""

    @property
    def found(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class GpuRequest:
    """A number of GPUs the monitor picks, or these indices."""

    count: int = 0
    indices: tuple[int, ...] = ()

    @property
    def wanted(self) -> bool:
        return bool(self.count or self.indices)


@dataclass(frozen=True)
class JobOptions:
    """How a submitted job runs and what it measures; every part is optional."""

    environment: Mapping[str, str] = field(default_factory=dict)
    wall_clock_limit: float | None = None  # seconds
    gpus: GpuRequest = GpuRequest()
    metrics: tuple[MetricSpec, ...] = ()
    workspace_id: str = ""


@dataclass(frozen=True)
class Command:
    """A program to start on this machine (host "") or on a configured SSH host."""

    argv: tuple[str, ...] = ()
    command_line: str = ""  # instead of argv: split as a POSIX shell would, never run by one
    working_directory: str = ""
    log_path: str = ""
    host: str = ""


@dataclass(frozen=True)
class JobObservation:
    """One look at a job: its state, exit code when known, and why; with its metrics once it has ended."""

    state: JobState
    exit_code: int | None = None
    detail: str = ""
    new_log_lines: tuple[str, ...] = field(default=())
    metric_points: tuple[MetricPoint, ...] = field(default=())
    metrics: tuple[MetricResult, ...] = field(default=())
