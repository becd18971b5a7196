"""What the monitor needs of each kind of job: the JobExecutor protocol, and what its parts share.

An executor checks a submission of its kind and starts it; looks at a job a watch names; follows a
job it started (after a restart too, as a job it did not start); reads a file the job wrote; and,
where the monitor stops jobs itself at their wall-clock limit, signals a job's process group.
Everything else about a job (its record, the request_id that names it, its GPUs, its log and file
metrics, its wall clock, its end) is written once, in monitor_svc/jobs/service.py and
supervision.py. A new kind of job is a module with an executor and a line in registry.py.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

from monitor_svc.gpus import GpuRequest
from monitor_svc.jobs.records import JobRecord
from monitor_svc.jobs.spec import JobKind, JobObservation, JobOptions, JobRequest
from monitor_svc.logs import LogCursor
from monitor_svc.metrics import CompiledMetric
from quarry.errors import QuarryError
from quarry.vocabulary import JobRef, JobState

# While a job starts: its GPUs chosen on its host (None: a scheduler picks them) and it is recorded.
Hold = Callable[[GpuRequest | None], AbstractAsyncContextManager[None]]
# A monitor that stops while a job starts, or a start that fails midway, cannot tell whether it started.
INTERRUPTED = "the monitor stopped while starting it, so whether it started is unknown"


class NotStarted(Exception):
    """Raised while held: the job did not start. Its record goes, and a retry may try again."""

    def __init__(self, error: QuarryError) -> None:
        super().__init__(str(error))
        self.error = error


class StartUnknown(Exception):
    """Raised while held: starting failed midway, so the job may run. It is given up as UNKNOWN (`detail`),
    never started again for its request_id; the caller gets `error`."""

    def __init__(self, detail: str, error: QuarryError) -> None:
        super().__init__(detail)
        self.detail = detail
        self.error = error


@dataclass(frozen=True)
class Prepared:
    """A checked submission: what makes a retry the same one, where the job runs, and how it starts."""

    payload: object  # as the request says (a workspace's directory relative to its root)
    argv: tuple[str, ...]  # recorded: the program and its arguments, if it has any
    host: str  # "" for this machine
    working_directory: str
    metrics: tuple[CompiledMetric, ...]
    # Starts the job of this new record: sets its log path, holds it while it starts, fills in its process or
    # scheduler id; the first state it is in. Raises a QuarryError before it holds, NotStarted or StartUnknown after.
    start: Callable[[JobRecord, Hold], Awaitable[JobObservation]]


def log_host(ref: JobRef) -> str:
    """Where a job's log is: "" for this machine."""
    return "" if ref.kind == JobKind.LOCAL else ref.host


@dataclass
class Watch:
    """What one look at a job remembers for the next: a WatchJob's, or the supervisor's of a Slurm job."""

    ref: JobRef
    cursor: LogCursor
    started: float = field(default_factory=time.monotonic)
    seen_alive: bool = False
    unknown_polls: int = 0
    time_limit: float | None = None

    @classmethod
    def of(cls, ref: JobRef) -> Watch:
        return cls(ref, LogCursor(ref.log_path, log_host(ref)))

    def gone(self, what: str) -> JobObservation:
        """A process that is not there: it ended, if it was seen before; else it never was."""
        if self.seen_alive:
            return JobObservation(JobState.EXITED, detail=f"{what} has ended; its exit status cannot be known")
        return JobObservation(JobState.NOT_FOUND, detail=f"{what} does not exist")


def exit_observation(returncode: int | None) -> JobObservation:
    """A process's end from its exit status (None: it still runs); negative: killed by that signal."""
    if returncode is None:
        return JobObservation(JobState.RUNNING, detail="running")
    if returncode == 0:
        return JobObservation(JobState.COMPLETED, 0, "exited with status 0")
    if returncode < 0:
        return JobObservation(JobState.FAILED, 128 - returncode, f"killed by signal {-returncode}")
    return JobObservation(JobState.FAILED, returncode, f"exited with status {returncode}")


class Follow(Protocol):
    """One job its executor started, as the supervisor follows it."""

    async def poll(self, previous: JobObservation) -> JobObservation:
        """Its state now; `previous` while its host cannot be reached."""

    async def pause(self, seconds: float) -> None:
        """Wait until the next poll (shorter when the job's end can be seen at once)."""


class ProcessGroups(Protocol):
    """How the monitor stops a job itself at its wall-clock limit: signals to its process group."""

    @property
    def poll_seconds(self) -> float:
        """How often to look whether the group has gone."""

    async def signal(self, record: JobRecord, number: signal.Signals) -> None: ...

    async def alive(self, record: JobRecord) -> bool:
        """Whether a process of the job's group still runs (True when that cannot be told)."""


class JobExecutor(Protocol):
    @property
    def kind(self) -> JobKind: ...

    @property
    def groups(self) -> ProcessGroups | None:
        """None: the job's scheduler stops it at its limit, so the monitor never does."""

    async def prepare(self, request: JobRequest, options: JobOptions, request_id: str) -> Prepared:
        """The submission checked (INVALID_ARGUMENT naming its fields) and placed (its workspace, its host)."""

    def check_ref(self, ref: JobRef) -> None:
        """A reference to a job of this kind that a watch can follow (INVALID_ARGUMENT naming the field)."""

    async def observe(self, watch: Watch) -> JobObservation:
        """A look at any job of this kind a watch names, started by the monitor or not."""

    def attach(self, record: JobRecord) -> Follow:
        """Follow a job it started: just now, or before the monitor restarted (then as a job it did not start)."""

    async def read_file(self, record: JobRecord, relative: str) -> bytes | None:
        """A file under the job's working directory (its last MAX_JSONL_BYTES); None when it does not exist."""
