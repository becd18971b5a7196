"""Campaign records: exact JSON round trips, strict types, the future's fields ignored, values that stay put."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from quarry.errors import Internal
from quarry.records.campaign import (
    SCHEMA_VERSION,
    CampaignRecord,
    DeadEnd,
    Decision,
    Directive,
    DirectiveConsumed,
    Insight,
    TrialRecord,
    Verdict,
    Violation,
    ViolationKind,
    record_from_json,
)
from quarry.vocabulary import JobState
from tests.supervisor_svc.campaigns.ledger import START, run

EVERY_KIND: list[CampaignRecord] = [
    run(4, Verdict.KEEP, 0.41),
    DeadEnd(cycle=5, approach="a learning rate of 1.0", reason="the loss diverged to NaN"),
    Insight(cycle=6, text="the loss is flat after 300 steps"),
    Directive(text="try a cosine schedule", request_id="req-1"),
    DirectiveConsumed(request_id="req-1", cycle=7),
    Decision(cycle=7, text="halve the steps: the job nearly hit its budget"),
    Violation(cycle=8, rule=ViolationKind.METRIC_FILE_EDITED, subject="results.json", detail="edited"),
]


@pytest.mark.parametrize("record", EVERY_KIND, ids=lambda record: record.kind)
def test_every_kind_round_trips_through_json_exactly(record: CampaignRecord) -> None:
    content = record.to_json()
    assert json.loads(content)["kind"] == record.kind
    assert json.loads(content)["schema_version"] == SCHEMA_VERSION
    read = record_from_json(content)
    assert type(read) is type(record)
    assert read == record
    assert read.to_json() == content


def test_a_ledger_record_keeps_a_metric_that_was_not_measured_and_the_job_state() -> None:
    record = TrialRecord(
        cycle=3,
        hypothesis="h",
        action="a",
        job_state=JobState.TIMED_OUT,
        metrics={"val_loss": None, "accuracy": 0.9},
        verdict=Verdict.FAILED,
        started_at=START,
        ended_at=START,
    )
    read = record_from_json(record.to_json())
    assert isinstance(read, TrialRecord)
    assert read.job_state is JobState.TIMED_OUT
    assert dict(read.metrics) == {"val_loss": None, "accuracy": 0.9}
    assert read.metric("val_loss") is None
    assert read.metric("never reported") is None


texts = st.text(max_size=200)
metric_values = st.none() | st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    cycle=st.integers(min_value=1, max_value=10**9),
    hypothesis=texts,
    conclusion=texts,
    metrics=st.dictionaries(st.text(max_size=20), metric_values, max_size=5),
    verdict=st.sampled_from(Verdict),
    exit_code=st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1),
    tokens=st.integers(min_value=0, max_value=10**12),
    seconds=st.integers(min_value=0, max_value=10**8),
    offset=st.timedeltas(min_value=timedelta(hours=-14), max_value=timedelta(hours=14)),
)
def test_any_ledger_record_round_trips_exactly(
    cycle: int,
    hypothesis: str,
    conclusion: str,
    metrics: dict[str, float | None],
    verdict: Verdict,
    exit_code: int | None,
    tokens: int,
    seconds: int,
    offset: timedelta,
) -> None:
    started = (START + timedelta(microseconds=seconds * 7)).astimezone(timezone(offset))
    record = TrialRecord(
        cycle=cycle,
        hypothesis=hypothesis,
        action=hypothesis[::-1],
        commit="abc",
        exit_code=exit_code,
        metrics=metrics,
        verdict=verdict,
        conclusion=conclusion,
        tokens_used=tokens,
        started_at=started,
        ended_at=started + timedelta(seconds=seconds),
    )
    assert record.started_at.utcoffset() == timedelta(0)
    assert record_from_json(record.to_json()) == record


def test_fields_a_newer_release_added_are_ignored_on_read() -> None:
    written = json.loads(EVERY_KIND[0].to_json())
    written |= {"schema_version": SCHEMA_VERSION + 1, "gpu_hours": 3.5, "reviewer": {"name": "x"}}
    read = record_from_json(json.dumps(written))
    assert isinstance(read, TrialRecord)
    assert read.schema_version == SCHEMA_VERSION + 1
    assert read.model_dump(exclude={"schema_version"}) == EVERY_KIND[0].model_dump(exclude={"schema_version"})


@pytest.mark.parametrize(
    ("field", "value"),
    [("cycle", "4"), ("tokens_used", 1.5), ("metrics", {"val_loss": "0.4"}), ("verdict", "KEEP"), ("cycle", 0)],
)
def test_types_are_strict_on_read(field: str, value: object) -> None:
    written = json.loads(EVERY_KIND[0].to_json()) | {field: value}
    with pytest.raises(Internal, match=field):
        record_from_json(json.dumps(written))


def test_timestamps_must_carry_a_zone() -> None:
    written = json.loads(EVERY_KIND[0].to_json()) | {"started_at": "2025-01-01T00:00:00"}
    with pytest.raises(Internal, match="started_at"):
        record_from_json(json.dumps(written))
    with pytest.raises(ValidationError):
        TrialRecord(
            cycle=1, hypothesis="", action="", verdict=Verdict.KEEP, started_at=datetime(2025, 1, 1), ended_at=START
        )


def test_a_record_cannot_end_before_it_starts() -> None:
    with pytest.raises(ValidationError, match="before started_at"):
        TrialRecord(
            cycle=1, hypothesis="", action="", verdict=Verdict.KEEP, started_at=START, ended_at=START - timedelta(1)
        )


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_metric_is_finite_or_none(value: float) -> None:
    with pytest.raises(ValidationError):
        TrialRecord(
            cycle=1,
            hypothesis="",
            action="",
            metrics={"val_loss": value},
            verdict=Verdict.KEEP,
            started_at=START,
            ended_at=START,
        )


@pytest.mark.parametrize(
    "content",
    ['{"kind": "milestone", "cycle": 1}', '{"cycle": 1}', "not json", '{"kind": "directive", "text": ""}'],
)
def test_content_that_is_no_record_is_an_internal_error(content: str) -> None:
    with pytest.raises(Internal, match="not a campaign record"):
        record_from_json(content)


def test_records_are_values() -> None:
    record = EVERY_KIND[0]
    assert isinstance(record, TrialRecord)
    with pytest.raises(ValidationError):
        record.verdict = Verdict.DISCARD  # type: ignore[misc]
    with pytest.raises(TypeError):
        record.metrics["val_loss"] = 0.0  # type: ignore[index]
    assert copy.deepcopy(record) is record
    assert record.metric("val_loss") == 0.41
