"""Ledger records for the campaign tests, with only what a test cares about spelled out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from quarry.records.campaign import TrialRecord, Verdict
from quarry.records.signals import MetricGoal
from quarry.vocabulary import JobState, MetricDirection

LOSS = MetricGoal("val_loss", MetricDirection.MINIMIZE)
START = datetime(2025, 1, 1, tzinfo=UTC)
CYCLE_MINUTES = 10


def run(
    cycle: int,
    verdict: Verdict,
    value: float | None = None,
    *,
    commit: str = "",
    tokens: int = 0,
    hypothesis: str = "",
    conclusion: str = "",
    metric: str = LOSS.name,
) -> TrialRecord:
    """Cycle `cycle`, started CYCLE_MINUTES after the one before and lasting five minutes."""
    started = START + timedelta(minutes=CYCLE_MINUTES * (cycle - 1))
    return TrialRecord(
        cycle=cycle,
        hypothesis=hypothesis or f"hypothesis {cycle}",
        action="edit config.toml and run train.py",
        commit=commit or f"c{cycle:03d}",
        job_id=f"job-{cycle}",
        job_state=JobState.FAILED if verdict is Verdict.FAILED else JobState.COMPLETED,
        exit_code=1 if verdict is Verdict.FAILED else 0,
        metrics={} if value is None else {metric: value},
        verdict=verdict,
        conclusion=conclusion,
        tokens_used=tokens,
        started_at=started,
        ended_at=started + timedelta(minutes=5),
    )


def baseline(first_cycle: int, *values: float, commit: str = "base") -> list[TrialRecord]:
    return [run(first_cycle + index, Verdict.BASELINE, value, commit=commit) for index, value in enumerate(values)]
