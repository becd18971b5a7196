"""What a job is asked to be, and what a look at one sees: the types every executor shares.

JobState and JobRef are the kernel's vocabulary; the metric types live with the metrics
(monitor_svc/metrics.py), the GPU request with the GPUs (monitor_svc/gpus.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from monitor_svc.gpus import GpuRequest
from monitor_svc.metrics import MetricPoint, MetricResult, MetricSpec
from quarry.vocabulary import JobState


class JobKind(enum.StrEnum):
    """What runs a job. The values are JobRef's kinds, as records store them and WatchJob names them."""

    LOCAL = "local"  # a process on this machine
    REMOTE = "remote"  # a process on a configured SSH host
    SLURM = "slurm"  # a batch job submitted with sbatch on a configured login host


@dataclass(frozen=True)
class JobOptions:
    """How a submitted job runs and what it measures; every part is optional."""

    environment: Mapping[str, str] = field(default_factory=dict)
    wall_clock_limit: float | None = None  # seconds
    gpus: GpuRequest = field(default_factory=GpuRequest)
    metrics: tuple[MetricSpec, ...] = ()
    workspace_id: str = ""
    isolate_network: bool = False  # a local job in the sandbox: no network namespace but its own


@dataclass(frozen=True)
class Command:
    """A program to start on this machine (host "") or on a configured SSH host."""

    argv: tuple[str, ...] = ()
    command_line: str = ""  # instead of argv: split as a POSIX shell would, never run by one
    working_directory: str = ""
    log_path: str = ""
    host: str = ""


@dataclass(frozen=True)
class BatchScript:
    """A batch script to submit on a login host, with the scheduler's own arguments."""

    host: str
    script_path: str
    sbatch_args: tuple[str, ...] = ()


# What SubmitJob asks an executor to run: a command (local, SSH) or a batch script (Slurm).
JobRequest = Command | BatchScript


@dataclass(frozen=True)
class JobObservation:
    """One look at a job: its state, exit code when known, and why; with its metrics once it has ended."""

    state: JobState
    exit_code: int | None = None
    detail: str = ""
    new_log_lines: tuple[str, ...] = field(default=())
    metric_points: tuple[MetricPoint, ...] = field(default=())
    metrics: tuple[MetricResult, ...] = field(default=())
