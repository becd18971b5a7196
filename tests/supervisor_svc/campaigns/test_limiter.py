"""The anti-burn limiter: rates over a sliding hour, error backoff, the failure bound and the total budgets."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quarry.records.campaign import Verdict
from supervisor_svc.campaigns.limiter import (
    RUN,
    CycleCost,
    Limit,
    Limits,
    Step,
    admit,
    backoff_seconds,
    consecutive_failures,
    tokens_left,
)
from tests.supervisor_svc.campaigns.ledger import START, run

MINUTE = timedelta(minutes=1)


def cycle(start_minute: float, *, tokens: int = 0, failure: str = "", minutes: float = 5) -> CycleCost:
    started = START + start_minute * MINUTE
    return CycleCost(started, started + minutes * MINUTE, tokens, failure)


def test_nothing_limits_a_fresh_campaign() -> None:
    assert admit([], START, Limits(tokens_per_hour=10, cycles_per_hour=1, max_tokens=10, max_cycles=1)) == RUN


def test_the_token_rate_sleeps_until_enough_tokens_leave_the_hour() -> None:
    history = [cycle(0, tokens=400), cycle(10, tokens=400), cycle(20, tokens=400)]
    limits = Limits(tokens_per_hour=1_000)
    admission = admit(history, START + 30 * MINUTE, limits)
    assert admission.step is Step.SLEEP
    assert admission.limit is Limit.TOKENS_PER_HOUR
    # The first cycle's tokens (counted from its end, minute 5) leave the window at minute 65.
    assert admission.sleep_seconds == 35 * 60
    assert "1200 tokens used in the last hour, the limit is 1000" in admission.reason
    assert admit(history, START + 65 * MINUTE, limits) == RUN


def test_one_cycle_over_the_hourly_tokens_waits_out_the_hour() -> None:
    admission = admit([cycle(0, tokens=5_000)], START + 5 * MINUTE, Limits(tokens_per_hour=1_000))
    assert admission.sleep_seconds == 60 * 60


def test_the_cycle_rate_sleeps_until_the_oldest_start_leaves_the_hour() -> None:
    history = [cycle(minute) for minute in (0, 10, 20)]
    admission = admit(history, START + 30 * MINUTE, Limits(cycles_per_hour=3))
    assert (admission.step, admission.limit, admission.sleep_seconds) == (Step.SLEEP, Limit.CYCLES_PER_HOUR, 30 * 60)
    assert admit(history, START + 30 * MINUTE, Limits(cycles_per_hour=4)) == RUN
    assert admit(history, START + 60 * MINUTE, Limits(cycles_per_hour=3)) == RUN


def test_the_backoff_doubles_after_each_failure_up_to_its_cap_and_resets_after_a_success() -> None:
    limits = Limits(backoff_base_seconds=60, backoff_max_seconds=300)
    assert [backoff_seconds(n, limits) for n in range(6)] == [0, 60, 120, 240, 300, 300]
    assert backoff_seconds(10_000, limits) == 300
    failed = [cycle(0, failure="boom"), cycle(10, failure="boom")]
    admission = admit(failed, START + 15 * MINUTE, Limits(max_consecutive_failures=0))
    assert (admission.step, admission.limit, admission.sleep_seconds) == (Step.SLEEP, Limit.ERROR_BACKOFF, 120)
    assert "2 failed cycle(s) in a row" in admission.reason
    assert admit(failed, START + 17 * MINUTE, Limits()) == RUN
    assert admit([*failed, cycle(20)], START + 25 * MINUTE, Limits()) == RUN


def test_too_many_failures_in_a_row_pause_the_campaign_until_a_human_resumes_it() -> None:
    failed = [cycle(10 * index, failure=f"exit code {index}") for index in range(3)]
    limits = Limits(max_consecutive_failures=3)
    admission = admit(failed, START + 3 * 60 * MINUTE, limits)
    assert (admission.step, admission.limit) == (Step.PAUSE, Limit.CONSECUTIVE_FAILURES)
    assert admission.reason == "3 cycles failed in a row; the last: exit code 2"
    assert admit(failed[:2], START + 3 * 60 * MINUTE, limits) == RUN
    resumed = admit(failed, START + 3 * 60 * MINUTE, limits, failures_since=START + 15 * MINUTE)
    assert resumed == RUN
    assert consecutive_failures(failed, since=START + 15 * MINUTE) == tuple(failed[2:])


@pytest.mark.parametrize(
    ("limits", "limit", "reason"),
    [
        (Limits(max_tokens=1_000), Limit.TOKEN_BUDGET, "1000 of 1000 tokens used"),
        (Limits(max_cycles=2), Limit.CYCLE_BUDGET, "2 of 2 cycles run"),
        (Limits(stop_at=START + 15 * MINUTE), Limit.STOP_TIME, "the stop time 2025-01-01T00:15:00+00:00 has passed"),
    ],
)
def test_a_spent_total_budget_ends_the_campaign(limits: Limits, limit: Limit, reason: str) -> None:
    history = [cycle(0, tokens=600), cycle(10, tokens=400)]
    admission = admit(history, START + 15 * MINUTE, limits)
    assert (admission.step, admission.limit, admission.reason) == (Step.DONE, limit, reason)
    assert admit(history[:1], START + 5 * MINUTE, limits).step is not Step.DONE


@pytest.mark.parametrize(("used", "done"), [(999, False), (1_000, True), (1_001, True)], ids=["under", "at", "over"])
def test_the_token_budget_is_spent_when_usage_reaches_it(used: int, done: bool) -> None:
    """Intended side: tokens used equal to max_tokens end the campaign (campaign.proto, CampaignBudgets:
    "Once a total budget is spent the campaign completes"); one token under lets one more cycle run."""
    admission = admit(
        [cycle(0, tokens=used - 400), cycle(10, tokens=400)], START + 15 * MINUTE, Limits(max_tokens=1_000)
    )
    assert admission.step is (Step.DONE if done else Step.RUN)
    assert admission.limit is (Limit.TOKEN_BUDGET if done else None)


@pytest.mark.parametrize(("cycles", "done"), [(2, False), (3, True), (4, True)], ids=["under", "at", "over"])
def test_the_cycle_budget_is_spent_when_the_last_allowed_cycle_has_run(cycles: int, done: bool) -> None:
    """Intended side: max_cycles=3 runs exactly three cycles; asked after the third, the campaign is DONE."""
    history = [cycle(10 * index) for index in range(cycles)]
    admission = admit(history, START + 60 * 60 * MINUTE, Limits(max_cycles=3))
    assert admission.step is (Step.DONE if done else Step.RUN)


@pytest.mark.parametrize(
    ("seconds", "done"), [(-0.001, False), (0.0, True), (0.001, True)], ids=["before", "at", "after"]
)
def test_the_stop_time_ends_the_campaign_from_that_instant(seconds: float, done: bool) -> None:
    """Intended side: at the stop time itself no cycle starts ("the stop time has passed" from `now >= stop_at`)."""
    stop_at = START + 30 * MINUTE
    admission = admit([], stop_at + timedelta(seconds=seconds), Limits(stop_at=stop_at))
    assert admission.step is (Step.DONE if done else Step.RUN)


@pytest.mark.parametrize(("used", "sleeps"), [(999, False), (1_000, True), (1_001, True)], ids=["under", "at", "over"])
def test_the_hourly_token_rate_sleeps_once_the_hour_reaches_its_limit(used: int, sleeps: bool) -> None:
    """Intended side: an hour that has used exactly tokens_per_hour has no room left, so the campaign sleeps
    until the oldest cycle's tokens leave the window; one token under, the next cycle runs."""
    history = [cycle(0, tokens=400), cycle(10, tokens=used - 400)]
    admission = admit(history, START + 20 * MINUTE, Limits(tokens_per_hour=1_000))
    if sleeps:
        assert (admission.step, admission.limit) == (Step.SLEEP, Limit.TOKENS_PER_HOUR)
        assert admission.sleep_seconds == 45 * 60  # the first cycle ended at minute 5; it leaves at 65
    else:
        assert admission == RUN


@pytest.mark.parametrize(("started", "sleeps"), [(2, False), (3, True), (4, True)], ids=["under", "at", "over"])
def test_the_hourly_cycle_rate_allows_exactly_its_count_per_hour(started: int, sleeps: bool) -> None:
    """Intended side: cycles_per_hour=3 lets three cycles start within an hour; asked with three started,
    the fourth sleeps."""
    history = [cycle(10 * index) for index in range(started)]
    admission = admit(history, START + 50 * MINUTE, Limits(cycles_per_hour=3))
    assert admission.step is (Step.SLEEP if sleeps else Step.RUN)


@pytest.mark.parametrize(("failures", "pauses"), [(2, False), (3, True), (4, True)], ids=["under", "at", "over"])
def test_the_campaign_pauses_at_exactly_max_consecutive_failures(failures: int, pauses: bool) -> None:
    """Intended side: "At `max_consecutive_failures` in a row the campaign pauses" (limiter.py)."""
    history = [cycle(10 * index, failure="boom") for index in range(failures)]
    admission = admit(history, START + 24 * 60 * MINUTE, Limits(max_consecutive_failures=3))
    assert admission.step is (Step.PAUSE if pauses else Step.RUN)


def test_done_outweighs_a_pause_and_a_pause_outweighs_a_sleep() -> None:
    failed = [cycle(0, tokens=600, failure="x"), cycle(10, tokens=600, failure="y")]
    now = START + 16 * MINUTE
    assert admit(failed, now, Limits(max_tokens=1_000, max_consecutive_failures=2)).step is Step.DONE
    assert admit(failed, now, Limits(tokens_per_hour=1_000, max_consecutive_failures=2)).step is Step.PAUSE


def test_the_longest_wait_is_the_one_reported() -> None:
    history = [cycle(0, tokens=2_000), cycle(10, failure="x")]
    admission = admit(history, START + 16 * MINUTE, Limits(tokens_per_hour=1_000, cycles_per_hour=2))
    assert (admission.limit, admission.sleep_seconds) == (Limit.TOKENS_PER_HOUR, 49 * 60)


def test_a_sleep_never_runs_past_the_stop_time() -> None:
    limits = Limits(tokens_per_hour=1_000, stop_at=START + 20 * MINUTE)
    admission = admit([cycle(0, tokens=2_000)], START + 10 * MINUTE, limits)
    assert (admission.step, admission.sleep_seconds) == (Step.SLEEP, 10 * 60)
    assert admit([cycle(0, tokens=2_000)], START + 20 * MINUTE, limits).step is Step.DONE


def test_a_ledger_record_gives_its_cost() -> None:
    failed = CycleCost.of(run(3, Verdict.FAILED, tokens=1_234, conclusion="the job exited with code 1"))
    assert (failed.tokens, failed.failure) == (1_234, "the job exited with code 1")
    assert failed.ended_at - failed.started_at == 5 * MINUTE
    assert CycleCost.of(run(4, Verdict.FAILED)).failure == "failed"
    assert CycleCost.of(run(5, Verdict.DISCARD, 0.5, conclusion="worse")).failure == ""


@pytest.mark.parametrize("limits", [{"max_tokens": -1}, {"backoff_base_seconds": 10, "backoff_max_seconds": 5}])
def test_limits_are_checked_when_made(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Limits(**limits)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    cycles=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 2_000), st.integers(0, 1_800)), max_size=12),
    tokens_per_hour=st.integers(0, 5_000),
    cycles_per_hour=st.integers(0, 6),
)
def test_after_sleeping_as_told_the_rates_let_the_next_cycle_run(
    cycles: list[tuple[int, int, int]], tokens_per_hour: int, cycles_per_hour: int
) -> None:
    history: list[CycleCost] = []
    now = START
    for gap_seconds, tokens, seconds in cycles:
        started = now + timedelta(seconds=gap_seconds)
        now = started + timedelta(seconds=seconds)
        history.append(CycleCost(started, now, tokens))
    limits = Limits(tokens_per_hour=tokens_per_hour, cycles_per_hour=cycles_per_hour)
    admission = admit(history, now, limits)
    assert admission.step in (Step.RUN, Step.SLEEP)
    if admission.step is Step.SLEEP:
        assert 0 < admission.sleep_seconds <= 3600
        assert admit(history, now + timedelta(seconds=admission.sleep_seconds), limits) == RUN


def test_a_cycle_may_spend_what_is_left_of_the_budget_and_of_the_hour_whichever_is_less() -> None:
    history = [cycle(0, tokens=400), cycle(70, tokens=250), cycle(100, tokens=100)]
    now = START + 110 * MINUTE  # the first cycle ended more than an hour ago
    assert tokens_left(history, now, Limits()) is None
    assert tokens_left(history, now, Limits(max_tokens=1000)) == 250
    assert tokens_left(history, now, Limits(tokens_per_hour=500)) == 150  # 350 in the last hour
    assert tokens_left(history, now, Limits(max_tokens=1000, tokens_per_hour=500)) == 150
    assert tokens_left(history, now, Limits(max_tokens=700)) == 0  # already over: nothing, never negative
