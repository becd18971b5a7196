"""Run domain types and the checks a StartRun request must pass, free of SQL."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from quarry import ids
from quarry.agent.usage import Usage
from quarry.errors import FieldViolation, InvalidArgument
from quarry.identity import Role

DEFAULT_SUPERVISOR_TURNS = 12
MAX_TURNS_LIMIT = 64
MAX_PARALLEL_LIMIT = 64
MAX_QUESTION_CHARS = 16_000
MAX_TIMEOUT_SECONDS = 24 * 3600
MAX_LABELS = 64


class RunState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


ACTIVE_STATES = (RunState.QUEUED.value, RunState.RUNNING.value)


class RunErrorCode(enum.StrEnum):
    PROVIDER_ERROR = "provider_error"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    INTERNAL = "internal"


class RunWarning(enum.StrEnum):
    """What a succeeded run's report lacks. The run still succeeds: the text is delivered, with the warning."""

    NO_DELEGATIONS = "no_delegations"
    NO_SOURCES = "no_sources"

    @property
    def message(self) -> str:
        return _WARNING_MESSAGES[self]


_WARNING_MESSAGES = {
    RunWarning.NO_DELEGATIONS: "the model never delegated research: nothing was searched, the report cites no source",
    RunWarning.NO_SOURCES: "no verified finding was cited: the report rests on no verified source",
}


@dataclass(frozen=True)
class RunOptions:
    max_supervisor_turns: int = 0  # 0: DEFAULT_SUPERVISOR_TURNS
    max_worker_turns: int = 0  # 0: the worker's default
    max_parallel_delegations: int = 0  # 0: the server's default
    timeout_seconds: float = 0.0  # 0: the server's default
    max_tokens: int = 0  # 0: no token budget

    # Stored (and hashed into a StartRun's request digest) under the field's first name, so that a
    # request_id retried across an upgrade still finds its run and every release reads every row.
    _STORED_NAMES: ClassVar[dict[str, str]] = {"max_worker_turns": "worker_max_turns"}

    def to_json(self) -> dict[str, Any]:
        return {self._STORED_NAMES.get(key, key): value for key, value in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunOptions:
        names = {stored: name for name, stored in cls._STORED_NAMES.items()}
        return cls(**{names.get(key, key): value for key, value in data.items()})


@dataclass(frozen=True)
class RunUsage:
    supervisor: Usage = field(default_factory=Usage)
    workers: Usage = field(default_factory=Usage)
    # The part of `workers` spent verifying (claim-verifiers, citation auditors, adjudicators).
    verification: Usage = field(default_factory=Usage)

    @property
    def total(self) -> Usage:
        return self.supervisor + self.workers

    def to_json(self) -> dict[str, Any]:
        return {
            "supervisor": self.supervisor.to_json(),
            "workers": self.workers.to_json(),
            "verification": self.verification.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunUsage:
        return cls(
            Usage.from_json(data.get("supervisor", {})),
            Usage.from_json(data.get("workers", {})),
            Usage.from_json(data.get("verification", {})),
        )


@dataclass(frozen=True)
class Citation:
    number: int
    url: str
    title: str
    excerpt: str
    sequence_no: int  # the scratchpad entry it comes from


@dataclass(frozen=True)
class Report:
    markdown: str
    citations: tuple[Citation, ...] = ()
    removed_citations: int = 0
    token_budget_exhausted: bool = False
    turn_budget_exhausted: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["citations"] = [asdict(citation) for citation in self.citations]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        citations = tuple(Citation(**citation) for citation in data.get("citations", []))
        return cls(**{**data, "citations": citations})


class ResearchPhase(enum.StrEnum):
    """What a status event says the run is doing."""

    STARTED = "started"
    PLANNING = "planning"
    WORKER_DELEGATED = "worker_delegated"
    WORKER_RESEARCHING = "worker_researching"
    WORKER_COMPLETED = "worker_completed"
    WORKER_FAILED = "worker_failed"
    SYNTHESIZING = "synthesizing"


@dataclass(frozen=True)
class DelegationOrder:
    """One bounded task for a worker, with the budgets it runs under."""

    delegation_id: str
    run_id: str
    tool_call_id: str
    scratchpad_thread_id: str
    objective: str
    criteria: tuple[str, ...]
    input_refs: tuple[str, ...]
    role: Role
    max_turns: int  # 0: the worker's default
    max_tokens: int  # 0: no token bound
    timeout_seconds: float
    workspace_id: str = ""  # the monitor's workspace an engineer works in; empty for other roles


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: what its terminal event says and what its row keeps."""

    state: RunState
    usage: RunUsage
    report: Report | None = None
    error_code: RunErrorCode | None = None
    message: str = ""  # the error, or why it was cancelled (cancellation is a state, not an error)
    warnings: tuple[RunWarning, ...] = ()  # what a succeeded run's report lacks

    @classmethod
    def succeeded(cls, report: Report, usage: RunUsage, warnings: tuple[RunWarning, ...] = ()) -> RunOutcome:
        return cls(RunState.SUCCEEDED, usage, report=report, warnings=warnings)

    @classmethod
    def failed(cls, code: RunErrorCode, message: str, usage: RunUsage) -> RunOutcome:
        return cls(RunState.FAILED, usage, error_code=code, message=message)

    @classmethod
    def cancelled(cls, reason: str, usage: RunUsage) -> RunOutcome:
        return cls(RunState.CANCELLED, usage, message=reason)


@dataclass(frozen=True)
class StartRequest:
    question: str
    options: RunOptions = RunOptions()
    labels: dict[str, str] = field(default_factory=dict)
    request_id: str = ""

    def digest(self) -> str:
        """What a request_id stands for: a repeat must ask for the same run."""
        payload = json.dumps([self.question, self.options.to_json(), self.labels], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    question: str
    state: RunState
    options: RunOptions
    labels: dict[str, str]
    scratchpad_thread_id: str
    report: Report | None
    error_code: RunErrorCode | None
    last_error: str
    usage: RunUsage
    last_sequence_no: int
    create_time: datetime
    start_time: datetime | None = None
    end_time: datetime | None = None
    cancel_reason: str = ""  # why it was cancelled, once it was
    warnings: tuple[RunWarning, ...] = ()  # what its report lacks, once it succeeded


def validate_start(request: StartRequest) -> None:
    """Every problem with a StartRun request at once, as field violations."""
    violations: list[FieldViolation] = []
    question = request.question
    if not question.strip():
        violations.append(FieldViolation("question", "required"))
    elif len(question) > MAX_QUESTION_CHARS:
        violations.append(FieldViolation("question", f"at most {MAX_QUESTION_CHARS} characters"))
    if "\x00" in question:
        violations.append(FieldViolation("question", "must not contain NUL characters"))
    options = request.options
    if not 0 <= options.max_supervisor_turns <= MAX_TURNS_LIMIT:
        violations.append(
            FieldViolation("options.max_supervisor_turns", f"between 1 and {MAX_TURNS_LIMIT} (0: default)")
        )
    if not 0 <= options.max_worker_turns <= MAX_TURNS_LIMIT:
        violations.append(FieldViolation("options.max_worker_turns", f"between 1 and {MAX_TURNS_LIMIT} (0: default)"))
    if not 0 <= options.max_parallel_delegations <= MAX_PARALLEL_LIMIT:
        violations.append(
            FieldViolation("options.max_parallel_delegations", f"between 1 and {MAX_PARALLEL_LIMIT} (0: default)")
        )
    if not 0 <= options.timeout_seconds <= MAX_TIMEOUT_SECONDS:
        violations.append(FieldViolation("options.timeout", f"between 0 and {MAX_TIMEOUT_SECONDS} seconds"))
    if options.max_tokens < 0:
        violations.append(FieldViolation("options.max_tokens", "must not be negative"))
    if len(request.labels) > MAX_LABELS:
        violations.append(FieldViolation("labels", f"at most {MAX_LABELS} labels"))
    for key, value in request.labels.items():
        if not ids.LABEL_KEY.matches(key):
            violations.append(
                FieldViolation(f"labels[{key!r}]", "keys are lowercase letters, digits, _ . -, starting with a letter")
            )
        if len(value) > 256 or "\x00" in value:
            violations.append(FieldViolation(f"labels[{key!r}]", "values are at most 256 characters, without NUL"))
    request_id = ids.REQUEST_ID.check("request_id", request.request_id, when_missing=None)
    if request_id:
        violations.append(request_id)
    if violations:
        raise InvalidArgument(violations)
