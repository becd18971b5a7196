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
from quarry.records.research import ClaimJudgement
from quarry.records.verification import Verification
from quarry.vocabulary import Tier

DEFAULT_SUPERVISOR_TURNS = 12
MAX_TURNS_LIMIT = 64
MAX_PARALLEL_LIMIT = 64
MAX_QUESTION_CHARS = 16_000
MAX_TIMEOUT_SECONDS = 24 * 3600
MAX_LABELS = 64
DEFAULT_REVISION_ROUNDS = 2
MAX_REVISION_ROUNDS = 8


class RunState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Research and verification are done; the run waits for ApproveRun or RejectRun. Still active: its
    # owner holds the lease, it takes events, and CancelRun still ends it. Stored as "awaiting": the state
    # column holds 16 characters, and widening it on SQLite would rebuild the runs table, whose
    # cascading foreign key would take every run's events with it.
    AWAITING_APPROVAL = "awaiting"

    @property
    def ended(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


ACTIVE_STATES = (RunState.QUEUED.value, RunState.RUNNING.value, RunState.AWAITING_APPROVAL.value)


class RunErrorCode(enum.StrEnum):
    PROVIDER_ERROR = "provider_error"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    INTERNAL = "internal"
    REJECTED = "rejected"  # a person rejected the run while it awaited approval
    UNAVAILABLE = "unavailable"  # its database stayed away longer than the run waits for it


class RunWarning(enum.StrEnum):
    """What a succeeded run's reader should know: its report lacks sources, its review did not finish, or its costs
    are estimates. The run still succeeds: the text is delivered, with the warning."""

    NO_DELEGATIONS = "no_delegations"
    NO_SOURCES = "no_sources"
    USAGE_ESTIMATED = "usage_estimated"
    VERIFICATION_INCOMPLETE = "verification_incomplete"
    ROLES_CANNOT_FOLLOW_CONTRACTS = "roles_cannot_follow_contracts"

    @property
    def message(self) -> str:
        return _WARNING_MESSAGES[self]


_WARNING_MESSAGES = {
    RunWarning.NO_DELEGATIONS: "the model never delegated research: nothing was searched, the report cites no source",
    RunWarning.NO_SOURCES: "no verified finding was cited: the report rests on no verified source",
    RunWarning.VERIFICATION_INCOMPLETE: (
        "the review did not finish: findings no verifier could judge are not cited, and cited sentences no "
        "auditor judged are marked “(unverified)” in the report (the budget or time ran out, or the review's "
        "roles failed: a model that cannot follow their instructions needs verification off)"
    ),
    RunWarning.ROLES_CANNOT_FOLLOW_CONTRACTS: (
        "the model could not follow the review roles' contracts: half or more of the verifier, auditor and "
        "adjudicator delegations ended without a valid output (output invalid or refused), so their checks were "
        "not made; "
        "this model cannot play those roles: run with verification off (quarry ask --verification off)"
    ),
    RunWarning.USAGE_ESTIMATED: (
        "the model server reported no token usage for some calls: token counts and the token budget rest on "
        "estimates (about four characters a token)"
    ),
}


# The roles that verify the research (their usage is RunUsage.verification): the run orders them, never the
# model, under keys of its own (verify-12, audit-3-r0).
REVIEW_ROLES = frozenset({Role.VERIFIER, Role.BIBLIOGRAPHIC_VERIFIER, Role.CITATION_AUDITOR, Role.ADJUDICATOR})


@dataclass(frozen=True)
class RunOptions:
    max_supervisor_turns: int = 0  # 0: DEFAULT_SUPERVISOR_TURNS
    max_worker_turns: int = 0  # 0: the worker's default
    max_parallel_delegations: int = 0  # 0: the server's default
    timeout_seconds: float = 0.0  # 0: the server's default
    max_tokens: int = 0  # 0: no token budget
    verification: str = ""  # "on", "off"; "": the server's default
    require_approval: bool = False  # once verified, wait for ApproveRun or RejectRun
    max_revision_rounds: int = 0  # 0: DEFAULT_REVISION_ROUNDS
    # (role, tier) pairs, as Role and Tier values: the tier each named role runs on in this run.
    role_tiers: tuple[tuple[str, str], ...] = ()

    # Stored (and hashed into a StartRun's request digest) under the field's first name, so that a
    # request_id retried across an upgrade still finds its run and every release reads every row.
    _STORED_NAMES: ClassVar[dict[str, str]] = {"max_worker_turns": "worker_max_turns"}
    # Options added later are stored (and hashed) only when set: a request that leaves them at their
    # defaults keeps the digest an earlier release computed, and its row reads as before.
    _LATER_OPTIONS: ClassVar[frozenset[str]] = frozenset(
        {"verification", "require_approval", "max_revision_rounds", "role_tiers"}
    )

    def to_json(self) -> dict[str, Any]:
        defaults = RunOptions()
        return {
            self._STORED_NAMES.get(key, key): value
            for key, value in asdict(self).items()
            if key not in self._LATER_OPTIONS or value != getattr(defaults, key)
        }

    def verifies(self, server_default: bool) -> bool:
        """Whether the run verifies its report: as asked, else as the server is configured."""
        return server_default if not self.verification else self.verification == VERIFICATION_ON

    @property
    def revision_rounds(self) -> int:
        return self.max_revision_rounds or DEFAULT_REVISION_ROUNDS

    def tier_for(self, role: Role) -> Tier | None:
        """The tier the run routes `role` to; None: the role's default."""
        return next((Tier(tier) for named, tier in self.role_tiers if named == role.value), None)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunOptions:
        names = {stored: name for name, stored in cls._STORED_NAMES.items()}
        options = {names.get(key, key): value for key, value in data.items()}
        if "role_tiers" in options:
            options["role_tiers"] = tuple((role, tier) for role, tier in options["role_tiers"])
        return cls(**options)


VERIFICATION_ON = "on"
VERIFICATION_OFF = "off"
VERIFICATION_MODES = ("", VERIFICATION_ON, VERIFICATION_OFF)


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
        stored = {"supervisor": self.supervisor.to_json(), "workers": self.workers.to_json()}
        if self.verification != Usage():  # stored only when spent: a run that did not verify reads as before
            stored["verification"] = self.verification.to_json()
        return stored

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
    judgement: ClaimJudgement | None = None  # how a blind claim-verifier judged it; None: not verified

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.judgement is None:  # as an earlier release stored it, so that release still reads the row
            del data["judgement"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Citation:
        judgement = data.get("judgement")
        return cls(**{**data, "judgement": ClaimJudgement(judgement) if judgement else None})


@dataclass(frozen=True)
class Report:
    markdown: str
    citations: tuple[Citation, ...] = ()
    removed_citations: int = 0
    token_budget_exhausted: bool = False
    turn_budget_exhausted: bool = False
    # Where in the markdown a marker naming no source was cut, for the review of a draft (not stored: a
    # reviewed report has settled them).
    invalid_markers: tuple[int, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["citations"] = [citation.to_json() for citation in self.citations]
        del data["invalid_markers"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        citations = tuple(Citation.from_json(citation) for citation in data.get("citations", []))
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
    VERIFYING_CLAIMS = "verifying_claims"
    AUDITING = "auditing"
    REVISING = "revising"
    ADJUDICATING = "adjudicating"
    AWAITING_APPROVAL = "awaiting_approval"


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
    tier: Tier | None = None  # the model tier the run routes its role to; None: the role's default
    # Ordered before this process took the run up: the worker that has it replays or goes on with it.
    resumed: bool = False


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: what its terminal event says and what its row keeps."""

    state: RunState
    usage: RunUsage
    report: Report | None = None
    error_code: RunErrorCode | None = None
    message: str = ""  # the error, or why it was cancelled (cancellation is a state, not an error)
    warnings: tuple[RunWarning, ...] = ()  # what a succeeded run's report lacks
    verification: Verification | None = None  # how the report was verified; None: it was not

    @classmethod
    def succeeded(
        cls,
        report: Report,
        usage: RunUsage,
        warnings: tuple[RunWarning, ...] = (),
        verification: Verification | None = None,
    ) -> RunOutcome:
        return cls(RunState.SUCCEEDED, usage, report=report, warnings=warnings, verification=verification)

    @classmethod
    def failed(cls, code: RunErrorCode, message: str, usage: RunUsage) -> RunOutcome:
        return cls(RunState.FAILED, usage, error_code=code, message=message)

    @classmethod
    def cancelled(cls, reason: str, usage: RunUsage) -> RunOutcome:
        return cls(RunState.CANCELLED, usage, message=reason)


class ApprovalDecision(enum.StrEnum):
    APPROVED = "approved"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Approval:
    """What ApproveRun or RejectRun decided for a run awaiting approval."""

    decision: ApprovalDecision
    note: str  # the approver's comment, or why it was rejected
    decided_by: str = ""  # the principal who took the decision


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
    verification: Verification | None = None  # how its report is verified, once verification began
    approval: Approval | None = None  # the decision ApproveRun or RejectRun took, once one did
    created_by: str = ""  # the principal who started it (empty: before principals were recorded)


def _role_tier_violations(role_tiers: tuple[tuple[str, str], ...]) -> list[FieldViolation]:
    delegated = {role.value for role in Role if role is not Role.SUPERVISOR}
    tiers = {tier.value for tier in Tier}
    violations, seen = [], set()
    for index, (role, tier) in enumerate(role_tiers):
        field = f"options.role_routes[{index}]"
        if role not in delegated:
            names = ", ".join(sorted(f"ROLE_{r.upper()}" for r in delegated))
            violations.append(FieldViolation(f"{field}.role", f"a delegated role: {names}"))
        elif role in seen:
            violations.append(FieldViolation(f"{field}.role", "each role is routed at most once"))
        if tier not in tiers:
            violations.append(FieldViolation(f"{field}.tier", "MODEL_TIER_WORKER or MODEL_TIER_SUPERVISOR"))
        seen.add(role)
    return violations


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
    if options.verification not in VERIFICATION_MODES:
        violations.append(FieldViolation("options.verification", "not a VerificationMode this server knows"))
    if not 0 <= options.max_revision_rounds <= MAX_REVISION_ROUNDS:
        violations.append(
            FieldViolation(
                "options.max_revision_rounds",
                f"between 1 and {MAX_REVISION_ROUNDS} (0: default {DEFAULT_REVISION_ROUNDS})",
            )
        )
    violations.extend(_role_tier_violations(options.role_tiers))
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
