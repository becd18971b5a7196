"""The domain words more than one package speaks: entries, delegation errors, GPUs and jobs.

The scratchpad stores entries; agents write and read them; the supervisor reports them. Each speaks of them
with these types, and quarry.convert translates them to and from quarry.v1 at the edges.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime

from quarry.agent.usage import Usage
from quarry.identity import Principal

__all__ = [
    "DelegationErrorCode",
    "DelegationResult",
    "Entry",
    "EntryKind",
    "Gpu",
    "GpuProcess",
    "JobLook",
    "JobMetric",
    "JobRef",
    "JobState",
    "MetricDirection",
    "MetricPoint",
    "Source",
    "Tier",
]


class EntryKind(enum.StrEnum):
    SEED = "seed"
    FINDING = "finding"
    MARKER = "marker"
    ACKNOWLEDGEMENT = "acknowledgement"
    NOTE = "note"
    VERDICT = "verdict"
    # The research ledger (quarry.records.research says what each holds).
    AUDIT = "audit"
    OBJECTION = "objection"
    ADJUDICATION = "adjudication"
    ASSIGNMENT = "assignment"
    ROUTE = "route"
    USAGE = "usage"
    RESOLUTION = "resolution"
    REFUSAL = "refusal"
    SENTENCE = "sentence"
    BIBLIOGRAPHIC_VERDICT = "bibliographic_verdict"
    CANDIDATES = "candidates"
    EVIDENCE = "evidence"

    CAMPAIGN_LEDGER = "campaign_ledger"
    CAMPAIGN_DEAD_END = "campaign_dead_end"
    CAMPAIGN_INSIGHT = "campaign_insight"
    CAMPAIGN_DIRECTIVE = "campaign_directive"
    CAMPAIGN_DECISION = "campaign_decision"


class Tier(enum.StrEnum):
    """Which model a delegation runs on: the worker's own, or the supervisor's (for roles that judge its work)."""

    WORKER = "worker"
    SUPERVISOR = "supervisor"


@dataclass(frozen=True)
class Source:
    """What a claim rests on: a page that was read, and the words quoted from it."""

    url: str
    title: str = ""
    excerpt: str = ""


@dataclass(frozen=True)
class Entry:
    """One committed scratchpad entry."""

    thread_id: str
    sequence_no: int
    kind: EntryKind
    author: Principal
    content: str
    sources: tuple[Source, ...]
    create_time: datetime
    request_id: str = ""


class DelegationErrorCode(enum.StrEnum):
    """Why a delegation failed, said alike by the worker that ran it and the supervisor that asked."""

    PROVIDER_ERROR = "provider_error"
    TURN_BUDGET_EXHAUSTED = "turn_budget_exhausted"
    TOKEN_BUDGET_EXHAUSTED = "token_budget_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    INVALID_TASK = "invalid_task"
    WORKER_UNAVAILABLE = "worker_unavailable"
    PROTOCOL_VIOLATION = "protocol_violation"
    INTERNAL = "internal"
    # A role's structured output, after its one repair turn: a kind or reference it may not emit...
    OUTPUT_REFUSED = "output_refused"
    # ...or one that does not match its schema. Either way nothing was recorded.
    OUTPUT_INVALID = "output_invalid"


@dataclass(frozen=True)
class DelegationResult:
    """How one delegation ended: the one result its Delegate stream carries, as the worker records it and
    the supervisor keeps it. A failure never carries a summary; entries promoted before it are listed."""

    delegation_id: str
    tool_call_id: str = ""
    conversation_id: str = ""
    error_code: DelegationErrorCode | None = None  # None: it succeeded
    error_message: str = ""
    summary: str = ""
    promoted: tuple[int, ...] = ()  # scratchpad sequence numbers
    turns: int = 0
    usage: Usage = field(default_factory=Usage)
    # The worker that ran it (its configured id); empty when no worker took it.
    worker_id: str = ""
    # An engineer's work, from its tools' state: the experiments it launched, the workspace files it changed.
    jobs: tuple[JobRef, ...] = ()
    files_changed: tuple[str, ...] = ()
    # A structured role's output on success: its kind, its JSON (a quarry.records.research model) and the
    # scratchpad entry it was recorded as; empty otherwise.
    output_kind: str = ""
    output_json: str = ""
    output_sequence_no: int = 0
    # The tier and model it ran on (usage is that tier's); None and empty when it never started.
    tier: Tier | None = None
    model: str = ""

    @property
    def succeeded(self) -> bool:
        return self.error_code is None

    @property
    def outcome_label(self) -> str:
        """ "succeeded" or the error code, as metrics and spans name outcomes."""
        return "succeeded" if self.error_code is None else self.error_code.value


# -- compute: what the monitor observes and the agents ask about ---------------------------------


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
class JobRef:
    """A job to watch: a local pid, a pid on an SSH host, or a Slurm job, and optionally its log file."""

    kind: str  # "local", "remote" or "slurm"
    pid: int = 0
    host: str = ""
    job_id: str = ""
    log_path: str = ""
    monitor_job_id: str = ""  # a job the monitor started and keeps a record of


class MetricDirection(enum.StrEnum):
    """Which way a job's metric improves; the values are what JSON specs and tools say."""

    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


@dataclass(frozen=True)
class MetricPoint:
    """One value of a metric as it appeared in a job's log: `step` is its line number (from 1)."""

    name: str
    value: float
    step: int


@dataclass(frozen=True)
class JobMetric:
    """A metric of a job the monitor started, once the job has ended: the last value read and the best."""

    name: str
    value: float | None = None  # None: not found
    best: float | None = None
    count: int = 0
    detail: str = ""  # why it was not found, or what was skipped


@dataclass(frozen=True)
class JobLook:
    """One look at a job."""

    state: JobState
    exit_code: int | None = None
    detail: str = ""
    log_tail: tuple[str, ...] = ()
    metrics: tuple[JobMetric, ...] = ()  # once a job the monitor started has ended


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int
    name: str = ""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int = 0
    memory_used_bytes: int = 0
    utilization_percent: int = 0
    temperature_celsius: int = 0
    power_watts: float = 0.0
    processes: tuple[GpuProcess, ...] = field(default=())
    host: str = ""
