"""REFLECT, pure: from the cycle's state and its job's end, the verdict, the records and the events to write.

Nothing here waits or writes: `reflect` says what the cycle concluded (its trial row, judged by
`signals.judge`), what to append to the campaign's thread (violations, a dead end), which events to
announce (violations, then the signals the row newly raised), and where to put the workspace back;
the loop writes it all, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from quarry.records.campaign import CampaignRecord, DeadEnd, TrialRecord, Verdict, Violation
from quarry.records.signals import Signals, read_signals
from quarry.vocabulary import JobState
from supervisor_svc.campaigns import events, violations
from supervisor_svc.campaigns.events import Event
from supervisor_svc.campaigns.spec import CampaignSpec
from supervisor_svc.campaigns.state import Progress, SignalKind

_T = TypeVar("_T")


@dataclass(frozen=True)
class JobEnd:
    """How the cycle's experiment ended, as the monitor reported it."""

    job_id: str
    state: JobState
    exit_code: int | None
    value: float | None  # the campaign's metric, when the job completed and reported it
    detail: str
    seconds: float | None = None  # how long the wait for it took (None: no job)

    @classmethod
    def not_run(cls, reason: str) -> JobEnd:
        return cls("", JobState.UNKNOWN, None, None, reason)


@dataclass(frozen=True)
class Trial:
    """What the cycle tried, from its start to its job's end."""

    cycle: int
    hypothesis: str
    action: str
    commit: str
    started: datetime
    tokens: int
    baseline: bool = False
    failed: bool = False  # nothing ran: THINK failed or changed nothing
    changed: tuple[str, ...] = ()  # the paths the cycle's commit changed


@dataclass(frozen=True)
class ReflectInput:
    spec: CampaignSpec
    signals: Signals  # as the cycle started
    trials: Sequence[TrialRecord]  # the trial rows before this cycle's
    trial: Trial
    end: JobEnd
    now: datetime


@dataclass(frozen=True)
class Keyed(Generic[_T]):
    """A record or an event written once per key."""

    key: str
    item: _T


@dataclass(frozen=True)
class Reflection:
    row: TrialRecord  # the cycle's trial row
    progress: Progress
    records: tuple[Keyed[CampaignRecord], ...]  # for the thread, before the row
    announced: tuple[Keyed[Event], ...]  # before the row: the violations
    signalled: tuple[Keyed[Event], ...]  # after the row: the signals it newly raised
    reset_to: str  # the kept commit the workspace goes back to; "" leaves it


def reflect(given: ReflectInput) -> Reflection:
    spec, trial, end, signals = given.spec, given.trial, given.end, given.signals
    cycle, name = trial.cycle, spec.metric.name
    if trial.failed or end.value is None:
        verdict = Verdict.FAILED
        reason = end.detail or f"the job ended {end.state.value} without a value for {name}"
        if end.job_id and not trial.failed:
            reason = f"the job ended {end.state.value} (exit code {end.exit_code}) without a value for {name}"
    elif trial.baseline:
        verdict, reason = Verdict.BASELINE, f"baseline {name} {end.value:.6g}"
    else:
        judgement = signals.judge(trial.commit, end.value)
        verdict, reason = judgement.verdict, judgement.reason
    row = TrialRecord(
        cycle=cycle,
        hypothesis=trial.hypothesis,
        action=trial.action,
        commit=trial.commit,
        job_id=end.job_id,
        job_state=end.state if end.job_id else None,
        exit_code=end.exit_code,
        metrics={name: end.value if verdict is not Verdict.FAILED else None},
        verdict=verdict,
        conclusion=reason,
        tokens_used=trial.tokens,
        started_at=trial.started,
        ended_at=given.now,
    )
    found = _violations(spec, trial, end)
    records: list[Keyed[CampaignRecord]] = [Keyed(f"c{cycle}/violation/{i}", v) for i, v in enumerate(found)]
    if verdict is Verdict.FAILED and not trial.baseline:
        records.append(Keyed(f"c{cycle}/dead-end", DeadEnd(cycle=cycle, approach=trial.hypothesis, reason=reason)))
    kept = signals.best_commit
    undone = verdict in (Verdict.DISCARD, Verdict.FAILED) and bool(kept) and not trial.baseline
    after = read_signals([*given.trials, row], spec.metric.goal, spec.signal_rules())
    return Reflection(
        row=row,
        progress=Progress(best_value=after.best, noise_floor=after.noise.floor if after.noise else None),
        records=tuple(records),
        announced=tuple(Keyed(f"c{cycle}/violation/{i}", events.violation(v)) for i, v in enumerate(found)),
        signalled=_signals(cycle, trial, signals, after),
        reset_to=kept if undone else "",
    )


def _violations(spec: CampaignSpec, trial: Trial, end: JobEnd) -> tuple[Violation, ...]:
    """Every rule of the brief or budget the cycle broke (by code, at no model cost)."""
    rules = violations.ScanRules(
        protected_paths=spec.brief.protected_paths,
        metric_paths=(spec.metric.jsonl_path,) if spec.metric.jsonl_path else (),
        job_budget_seconds=spec.experiment.wall_clock_seconds or 0.0,
    )
    activity = violations.CycleActivity(
        trial.cycle, trial.changed, end.job_id, end.state if end.job_id else None, end.seconds
    )
    return violations.scan_violations(activity, rules)


def _signals(cycle: int, trial: Trial, before: Signals, after: Signals) -> tuple[Keyed[Event], ...]:
    """The signals this cycle's row raised: the noise floor once the baseline is measured, stagnation, the gate."""
    raised: list[Keyed[Event]] = []
    if trial.baseline and after.noise is not None and not after.baseline_runs_needed:
        noise = after.noise
        said = f"noise floor {noise.floor:.6g} over {noise.runs} baseline runs (mean {noise.mean:.6g})"
        raised.append(Keyed(f"c{cycle}/noise", events.signal(SignalKind.NOISE_FLOOR, said, noise.floor)))
    if after.stagnant and not before.stagnant:
        said = after.describe().splitlines()[-1]
        raised.append(Keyed(f"c{cycle}/stagnant", events.signal(SignalKind.STAGNATION, said)))
    if after.phase_gate_cleared and not before.phase_gate_cleared and after.best is not None:
        gate = events.signal(SignalKind.PHASE_GATE, "the best clears the phase gate", after.best)
        raised.append(Keyed(f"c{cycle}/gate", gate))
    return tuple(raised)
