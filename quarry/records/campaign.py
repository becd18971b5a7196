"""The typed, immutable records a campaign appends to its scratchpad thread, as JSON content.

Every record is a `quarry.records.base.Record`, under its forward-compatibility policy: reading a
thread back (`record_from_json`) is strict about types (a number written as a string is refused,
timestamps must carry a zone) and forgiving about the future: fields a newer release added are
ignored, so an older supervisor or command line still reads a newer thread. Records are values:
frozen, metrics included.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    PlainSerializer,
    TypeAdapter,
    model_validator,
)

from quarry.errors import Internal
from quarry.records.base import SCHEMA_VERSION, Record, RecordError, read_stored
from quarry.vocabulary import JobState

__all__ = [
    "SCHEMA_VERSION",
    "CampaignRecord",
    "CampaignReport",
    "DeadEnd",
    "Decision",
    "Directive",
    "DirectiveConsumed",
    "Insight",
    "InsightSource",
    "Metrics",
    "TrialRecord",
    "UtcDatetime",
    "Verdict",
    "Violation",
    "ViolationKind",
    "record_from_json",
]


class Verdict(enum.StrEnum):
    """What a cycle's run decided for the campaign's branch."""

    BASELINE = "baseline"  # a measurement of the unchanged kept state (noise floor, best so far)
    KEEP = "keep"  # an improvement beyond the noise: the commit stays on the branch
    DISCARD = "discard"  # no improvement: the workspace goes back to the last kept commit
    RETEST = "retest"  # an improvement inside the noise: run the same commit again
    FAILED = "failed"  # no metric: the change, the job or the cycle failed


class ViolationKind(enum.StrEnum):
    PROTECTED_PATH_TOUCHED = "protected_path_touched"
    METRIC_FILE_EDITED = "metric_file_edited"
    JOB_OVER_BUDGET = "job_over_budget"


def _read_only(metrics: Mapping[str, float | None]) -> Mapping[str, float | None]:
    return MappingProxyType(dict(metrics))


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


# Stored in UTC: any zone's offset survives as the instant it names, and the JSON is the same whatever wrote it.
UtcDatetime = Annotated[AwareDatetime, AfterValidator(_utc)]

# JSON has no NaN or infinity, so a metric is finite or None (not measured): the round trip is exact.
Metrics = Annotated[
    Mapping[str, FiniteFloat | None],
    AfterValidator(_read_only),
    PlainSerializer(dict, return_type=dict[str, float | None]),
]


class TrialRecord(Record):
    """One cycle's trial: what was tried, where, how the job ended, what it measured and what was decided.

    Stored with the kind "ledger", and listed by ListLedgerRows, as before the record was named for what it
    is: "ledger" in this code means a run's delegation accounting (supervisor_svc/runs/ledger.py)."""

    kind: Literal["ledger"] = "ledger"
    cycle: int = Field(ge=1)
    hypothesis: str
    action: str
    commit: str = ""  # "" when the cycle failed before committing
    job_id: str = ""  # "" when no job was launched
    job_state: JobState | None = None
    exit_code: int | None = None
    metrics: Metrics = Field(default_factory=lambda: MappingProxyType({}))
    verdict: Verdict
    conclusion: str = ""
    tokens_used: int = Field(default=0, ge=0)
    started_at: UtcDatetime
    ended_at: UtcDatetime

    @model_validator(mode="after")
    def _ends_after_it_starts(self) -> Self:
        if self.ended_at < self.started_at:
            raise ValueError("ended_at is before started_at")
        return self

    def metric(self, name: str) -> float | None:
        """The run's value of one metric; None when it was not measured."""
        return self.metrics.get(name)


class DeadEnd(Record):
    """An approach that failed, and why: THINK is told never to retry it."""

    kind: Literal["dead_end"] = "dead_end"
    cycle: int = Field(ge=1)
    approach: str
    reason: str


class InsightSource(BaseModel):
    """A finding an insight rests on: its entry on the campaign's thread and the page it quotes."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    finding_ref: int = Field(ge=1)
    url: str
    excerpt: str


class Insight(Record):
    """A durable observation worth keeping beyond the rolling memory, with the findings it rests on (the
    literature research of its cycle promoted them)."""

    kind: Literal["insight"] = "insight"
    cycle: int = Field(ge=1)
    text: str
    sources: tuple[InsightSource, ...] = ()


class Directive(Record):
    """A human's instruction for the next THINK; `request_id` makes sending it idempotent."""

    kind: Literal["directive"] = "directive"
    text: str = Field(min_length=1)
    request_id: str = Field(min_length=1)


class DirectiveConsumed(Record):
    """The directive `request_id` was given to the THINK of `cycle`; it is never given again."""

    kind: Literal["directive_consumed"] = "directive_consumed"
    request_id: str = Field(min_length=1)
    cycle: int = Field(ge=1)


class Decision(Record):
    """A decision the leader took and its reason, as the rolling memory keeps them."""

    kind: Literal["decision"] = "decision"
    cycle: int = Field(ge=1)
    text: str
    # The commit the cycle's experiment runs on, once made: a loop that restarts mid-cycle runs (or finds
    # again) that experiment instead of thinking again.
    commit: str = ""
    action: str = ""
    tokens_used: int = Field(default=0, ge=0)


class Violation(Record):
    """A rule of the brief or the budget the cycle broke; `subject` is the path or the job concerned."""

    kind: Literal["violation"] = "violation"
    cycle: int = Field(ge=1)
    rule: ViolationKind
    subject: str
    detail: str


class CampaignReport(Record):
    """A report the writer wrote of the campaign (WriteCampaignReport), from the ledger's first `cycles` rows:
    Markdown whose prose passed the figure check (`checked`), or without the prose and with the `problems`."""

    kind: Literal["report"] = "report"
    request_id: str = Field(min_length=1)
    markdown: str
    cycles: int = Field(ge=0)
    checked: bool
    problems: tuple[str, ...] = ()
    tokens_used: int = Field(default=0, ge=0)
    written_at: UtcDatetime


CampaignRecord = Annotated[
    TrialRecord | DeadEnd | Insight | Directive | DirectiveConsumed | Decision | Violation | CampaignReport,
    Field(discriminator="kind"),
]

_RECORD: TypeAdapter[CampaignRecord] = TypeAdapter(CampaignRecord)


def record_from_json(content: str) -> CampaignRecord:
    """The record a thread entry holds; INTERNAL when the content is not one (the thread is written by code)."""
    try:
        return read_stored(_RECORD, content)
    except RecordError as error:
        raise Internal(f"not a campaign record: {error.problems[0]}") from error
