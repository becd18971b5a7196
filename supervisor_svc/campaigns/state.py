"""A campaign as the supervisor keeps it: its state and phase, its counters, its directives, its running job.

What the store holds of a campaign besides the spec a human gave (spec.py): the state machine's
states, the loop's phases, the progress a cycle reports, and the tokens used over the last hour.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from quarry.vocabulary import JobRef, JobState, MetricPoint
from supervisor_svc.campaigns.spec import CampaignSpec


class CampaignState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SLEEPING = "sleeping"
    PAUSED = "paused"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def live(self) -> bool:
        """A loop should be driving it, under a lease."""
        return self in _LIVE

    @property
    def ended(self) -> bool:
        return self in _ENDED


_LIVE = frozenset({CampaignState.QUEUED, CampaignState.RUNNING, CampaignState.SLEEPING})
_ENDED = frozenset({CampaignState.STOPPED, CampaignState.COMPLETED, CampaignState.FAILED})
LIVE_STATES = tuple(sorted(state.value for state in _LIVE))
ENDED_STATES = tuple(sorted(state.value for state in _ENDED))


class Phase(enum.StrEnum):
    BASELINE = "baseline"
    THINK = "think"
    EXECUTE = "execute"
    WAITING = "waiting"
    REFLECT = "reflect"
    IDLE = "idle"


class SignalKind(enum.StrEnum):
    STAGNATION = "stagnation"
    PHASE_GATE = "phase_gate"
    NOISE_FLOOR = "noise_floor"


class DirectiveState(enum.StrEnum):
    PENDING = "pending"
    CONSUMED = "consumed"


# -- what the store keeps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CampaignRecord:
    campaign_id: str
    spec: CampaignSpec
    state: CampaignState
    phase: Phase
    cycle: int
    best_value: float | None
    noise_floor: float | None
    tokens: int
    tokens_last_hour: int
    cycles: int
    branch: str
    scratchpad_thread_id: str
    pause_reason: str
    end_reason: str
    pending_directives: int
    last_sequence_no: int
    sleep_until: datetime | None
    sleep_reason: str
    # The last ResumeCampaign: failures before it do not count towards the pause bound.
    resume_time: datetime | None
    create_time: datetime
    update_time: datetime
    end_time: datetime | None
    created_by: str = ""  # the principal who started it (empty: before principals were recorded)


@dataclass(frozen=True)
class DirectiveRecord:
    campaign_id: str
    request_id: str
    text: str
    state: DirectiveState
    consumed_cycle: int
    create_time: datetime
    sent_by: str = ""  # the principal who sent it


@dataclass(frozen=True)
class Progress:
    """What a cycle learned that GetCampaign shows; None leaves a value as it is."""

    best_value: float | None = None
    noise_floor: float | None = None


@dataclass(frozen=True)
class JobProgress:
    """The running experiment as the monitor last reported it."""

    cycle: int
    job: JobRef
    state: JobState
    gpu_indices: tuple[int, ...] = ()
    log_tail: tuple[str, ...] = ()
    metric_points: tuple[MetricPoint, ...] = ()


def branch_name(campaign_id: str) -> str:
    return f"quarry/{campaign_id}"


# -- tokens over the last hour -----------------------------------------------------------------------

# Tokens by the minute they were used in, [minute, tokens] pairs: a bounded window of an hour.
USAGE_WINDOW = timedelta(hours=1)


def _minute(moment: datetime) -> int:
    return int(moment.timestamp() // 60)


def add_usage(window: Sequence[Sequence[int]], now: datetime, tokens: int) -> list[list[int]]:
    """The window with `tokens` used at `now`, minutes older than an hour dropped."""
    current, oldest = _minute(now), _minute(now - USAGE_WINDOW)
    kept = [[minute, used] for minute, used in window if minute > oldest]
    if kept and kept[-1][0] == current:
        kept[-1][1] += tokens
    else:
        kept.append([current, tokens])
    return kept


def usage_in_window(window: Sequence[Sequence[int]], now: datetime) -> int:
    oldest = _minute(now - USAGE_WINDOW)
    return sum(used for minute, used in window if minute > oldest)
