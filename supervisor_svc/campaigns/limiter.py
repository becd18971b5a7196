"""The anti-burn limiter: whether the next cycle may start now, and if not, for how long or why not at all.

One pure question, asked before each cycle with the time passed in: the campaign's cycles so
far and its limits give RUN, SLEEP (with the seconds and the reason, which the campaign
reports), PAUSE (too many failures in a row: a human must look) or DONE (a total budget is
spent). Checked in that order of weight: DONE, then PAUSE, then the longest of the waits.

- Rates: tokens and cycles over the last hour (a sliding window); a cycle's tokens count from
  its end, the cycle itself from its start.
- Error backoff: after n failed cycles in a row the next waits base x 2^(n-1) seconds from the
  last one's end, at most `backoff_max_seconds`; one success resets it. At
  `max_consecutive_failures` in a row the campaign pauses; failures before `failures_since`
  (its last resume) do not count.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from quarry.records.campaign import TrialRecord, Verdict

WINDOW = timedelta(hours=1)
DEFAULT_BACKOFF_BASE_SECONDS = 60.0
DEFAULT_BACKOFF_MAX_SECONDS = 3600.0
DEFAULT_MAX_CONSECUTIVE_FAILURES = 5


@dataclass(frozen=True)
class Limits:
    """A campaign's budgets; 0 (or None) leaves a bound off."""

    tokens_per_hour: int = 0
    cycles_per_hour: int = 0
    max_tokens: int = 0
    max_cycles: int = 0
    stop_at: datetime | None = None
    backoff_base_seconds: float = DEFAULT_BACKOFF_BASE_SECONDS
    backoff_max_seconds: float = DEFAULT_BACKOFF_MAX_SECONDS
    max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE_FAILURES

    def __post_init__(self) -> None:
        counts = (self.tokens_per_hour, self.cycles_per_hour, self.max_tokens, self.max_cycles)
        if min(counts) < 0 or self.max_consecutive_failures < 0:
            raise ValueError("budgets and bounds must not be negative")
        if not 0 <= self.backoff_base_seconds <= self.backoff_max_seconds:
            raise ValueError("backoff: 0 <= base <= max")


@dataclass(frozen=True)
class CycleCost:
    """What one cycle cost, and why it failed ("" when it did not)."""

    started_at: datetime
    ended_at: datetime
    tokens: int
    failure: str = ""

    @classmethod
    def of(cls, record: TrialRecord) -> CycleCost:
        failure = (record.conclusion or "failed") if record.verdict is Verdict.FAILED else ""
        return cls(record.started_at, record.ended_at, record.tokens_used, failure)


class Step(enum.StrEnum):
    RUN = "run"
    SLEEP = "sleep"
    PAUSE = "pause"
    DONE = "done"


class Limit(enum.StrEnum):
    """The bound behind a step other than RUN."""

    TOKENS_PER_HOUR = "tokens_per_hour"
    CYCLES_PER_HOUR = "cycles_per_hour"
    ERROR_BACKOFF = "error_backoff"
    CONSECUTIVE_FAILURES = "consecutive_failures"
    TOKEN_BUDGET = "token_budget"
    CYCLE_BUDGET = "cycle_budget"
    STOP_TIME = "stop_time"


@dataclass(frozen=True)
class Admission:
    step: Step
    limit: Limit | None = None
    reason: str = ""
    sleep_seconds: float = 0.0  # SLEEP only: ask again after this long


RUN = Admission(Step.RUN)


def admit(
    history: Sequence[CycleCost], now: datetime, limits: Limits, *, failures_since: datetime | None = None
) -> Admission:
    """May the next cycle start at `now`, after `history` (oldest first)?"""
    done = _done(history, now, limits)
    if done is not None:
        return done
    failures = consecutive_failures(history, since=failures_since)
    bound = limits.max_consecutive_failures
    if bound and len(failures) >= bound:
        reason = f"{len(failures)} cycles failed in a row; the last: {failures[-1].failure}"
        return Admission(Step.PAUSE, Limit.CONSECUTIVE_FAILURES, reason)
    waits = [
        wait
        for wait in (
            _backoff(failures, now, limits),
            _token_rate(history, now, limits),
            _cycle_rate(history, now, limits),
        )
        if wait is not None and wait.sleep_seconds > 0
    ]
    if not waits:
        return RUN
    longest = max(waits, key=lambda wait: wait.sleep_seconds)
    if limits.stop_at is not None:  # never sleep past the end: wake up to finish
        until_stop = (limits.stop_at - now).total_seconds()
        return Admission(Step.SLEEP, longest.limit, longest.reason, min(longest.sleep_seconds, until_stop))
    return longest


def tokens_left(history: Sequence[CycleCost], now: datetime, limits: Limits) -> int | None:
    """What the next cycle may spend before it crosses the token budget or the hour's token limit (None: no
    bound). The cycle stops before a model call that would cross it."""
    bounds = []
    if limits.max_tokens:
        bounds.append(limits.max_tokens - sum(cost.tokens for cost in history))
    if limits.tokens_per_hour:
        recent = sum(cost.tokens for cost in history if cost.ended_at > now - WINDOW)
        bounds.append(limits.tokens_per_hour - recent)
    return max(min(bounds), 0) if bounds else None


def consecutive_failures(history: Sequence[CycleCost], *, since: datetime | None = None) -> tuple[CycleCost, ...]:
    """The failed cycles at the end of `history`, oldest first; cycles started before `since` do not count."""
    streak: list[CycleCost] = []
    for cost in reversed(history):
        if not cost.failure or (since is not None and cost.started_at < since):
            break
        streak.append(cost)
    return tuple(reversed(streak))


def backoff_seconds(failures: int, limits: Limits) -> float:
    """The cooldown after `failures` failed cycles in a row: doubling from the base, capped."""
    if failures <= 0:
        return 0.0
    # Capping the exponent keeps the arithmetic finite however long the streak.
    doubling = float(2 ** min(failures - 1, 64))
    return min(limits.backoff_base_seconds * doubling, limits.backoff_max_seconds)


def _done(history: Sequence[CycleCost], now: datetime, limits: Limits) -> Admission | None:
    if limits.stop_at is not None and now >= limits.stop_at:
        return Admission(Step.DONE, Limit.STOP_TIME, f"the stop time {limits.stop_at.isoformat()} has passed")
    if limits.max_cycles and len(history) >= limits.max_cycles:
        return Admission(Step.DONE, Limit.CYCLE_BUDGET, f"{len(history)} of {limits.max_cycles} cycles run")
    tokens = sum(cost.tokens for cost in history)
    if limits.max_tokens and tokens >= limits.max_tokens:
        return Admission(Step.DONE, Limit.TOKEN_BUDGET, f"{tokens} of {limits.max_tokens} tokens used")
    return None


def _backoff(failures: Sequence[CycleCost], now: datetime, limits: Limits) -> Admission | None:
    if not failures:
        return None
    cooldown = backoff_seconds(len(failures), limits)
    wait = (failures[-1].ended_at + timedelta(seconds=cooldown) - now).total_seconds()
    reason = f"{len(failures)} failed cycle(s) in a row: cooling down {cooldown:.0f} s after the last"
    return Admission(Step.SLEEP, Limit.ERROR_BACKOFF, reason, wait)


def _token_rate(history: Sequence[CycleCost], now: datetime, limits: Limits) -> Admission | None:
    if not limits.tokens_per_hour:
        return None
    recent = sorted((cost for cost in history if cost.ended_at > now - WINDOW), key=lambda cost: cost.ended_at)
    used = sum(cost.tokens for cost in recent)
    if used < limits.tokens_per_hour:
        return None
    # Wait until enough of the oldest cycles leave the window to bring the hour under its limit.
    gone = itertools.accumulate(cost.tokens for cost in recent)
    leaving = next(cost for cost, tokens in zip(recent, gone, strict=True) if used - tokens < limits.tokens_per_hour)
    reason = f"{used} tokens used in the last hour, the limit is {limits.tokens_per_hour}"
    return Admission(Step.SLEEP, Limit.TOKENS_PER_HOUR, reason, (leaving.ended_at + WINDOW - now).total_seconds())


def _cycle_rate(history: Sequence[CycleCost], now: datetime, limits: Limits) -> Admission | None:
    if not limits.cycles_per_hour:
        return None
    starts = sorted(cost.started_at for cost in history if cost.started_at > now - WINDOW)
    if len(starts) < limits.cycles_per_hour:
        return None
    # The oldest starts leave the window one by one; the hour has room once one more than the excess left.
    leaving = starts[len(starts) - limits.cycles_per_hour]
    reason = f"{len(starts)} cycles started in the last hour, the limit is {limits.cycles_per_hour}"
    return Admission(Step.SLEEP, Limit.CYCLES_PER_HOUR, reason, (leaving + WINDOW - now).total_seconds())
