"""What code computes from the ledger for THINK and REFLECT: noise floor, best, verdicts, stagnation, phase gate.

The rules, in short (docs/architecture.md, "Campaigns", says why):

- Noise floor: the unchanged kept state is run `baseline_runs` times (a batch); the floor is
  max(2 x the sample standard deviation of the batch, `noise_epsilon`). A new batch is due every
  `rebaseline_every` measured experiments, and the latest batch with two values or more sets the floor.
- Best: the value a candidate must beat is the kept state's, measured last: the mean of the latest
  baseline batch, or of a candidate kept after it.
- Verdict: a candidate's runs (the first and its retests) are combined by their mean. KEEP needs a
  gain over the best beyond floor / sqrt(runs) (the same two standard deviations, for a mean), so one
  run inside the noise is never kept. A smaller gain is retested, at most `max_retests` times, then
  discarded; no gain is discarded; a run without a value failed.
- Stagnation: `stagnation_window` experiments without a kept improvement.
- Phase gate: the best clears `phase_gate` (at or below it when minimizing, at or above when maximizing).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from quarry.records.campaign import TrialRecord, Verdict
from quarry.vocabulary import MetricDirection

__all__ = [
    "DEFAULT_BASELINE_RUNS",
    "DEFAULT_MAX_RETESTS",
    "DEFAULT_NOISE_EPSILON",
    "DEFAULT_REBASELINE_EVERY",
    "DEFAULT_STAGNATION_WINDOW",
    "Judgement",
    "MetricGoal",
    "NoiseFloor",
    "PendingRetest",
    "SignalRules",
    "Signals",
    "baseline_batches",
    "judge",
    "noise_floor",
    "read_signals",
]

DEFAULT_BASELINE_RUNS = 3
DEFAULT_REBASELINE_EVERY = 20
DEFAULT_NOISE_EPSILON = 1e-6
DEFAULT_MAX_RETESTS = 2
DEFAULT_STAGNATION_WINDOW = 10

# Runs that measured a candidate; a baseline batch ends at the first of them.
_MEASURED = frozenset({Verdict.KEEP, Verdict.DISCARD, Verdict.RETEST})


@dataclass(frozen=True)
class MetricGoal:
    """The metric a campaign optimizes, by the name the monitor's parser reports it under."""

    name: str
    direction: MetricDirection

    def gain(self, value: float, over: float) -> float:
        """How much better `value` is than `over`; negative when it is worse."""
        return over - value if self.direction is MetricDirection.MINIMIZE else value - over

    def clears(self, value: float, bar: float) -> bool:
        return self.gain(value, bar) >= 0


@dataclass(frozen=True)
class SignalRules:
    """A campaign's settings for its signals; each bound is checked when the rules are made."""

    baseline_runs: int = DEFAULT_BASELINE_RUNS
    rebaseline_every: int = DEFAULT_REBASELINE_EVERY  # measured experiments between batches; 0: only at the start
    noise_epsilon: float = DEFAULT_NOISE_EPSILON  # the smallest floor: about the metric's resolution
    max_retests: int = DEFAULT_MAX_RETESTS
    stagnation_window: int = DEFAULT_STAGNATION_WINDOW  # 0: never stagnant
    phase_gate: float | None = None

    def __post_init__(self) -> None:
        if self.baseline_runs < 2:
            raise ValueError("baseline_runs: at least 2 (a spread needs two runs)")
        if self.rebaseline_every < 0 or self.max_retests < 0 or self.stagnation_window < 0:
            raise ValueError("rebaseline_every, max_retests and stagnation_window must not be negative")
        if not (math.isfinite(self.noise_epsilon) and self.noise_epsilon > 0):
            raise ValueError("noise_epsilon: a positive number")
        if self.phase_gate is not None and not math.isfinite(self.phase_gate):
            raise ValueError("phase_gate: a finite number")


@dataclass(frozen=True)
class NoiseFloor:
    floor: float
    mean: float
    sample_std: float
    runs: int


def noise_floor(values: Sequence[float], *, epsilon: float = DEFAULT_NOISE_EPSILON) -> NoiseFloor:
    """The floor of repeated measurements of one unchanged state: max(2 x sample std, epsilon)."""
    if len(values) < 2:
        raise ValueError("a noise floor needs at least two measurements")
    spread = statistics.stdev(values)
    return NoiseFloor(max(2 * spread, epsilon), statistics.fmean(values), spread, len(values))


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    value: float | None  # the mean of the candidate's runs; None when a run has no value
    gain: float | None  # the value's improvement over the best; negative when worse
    threshold: float | None  # the gain KEEP needed with this many runs
    reason: str


def judge(
    runs: Sequence[float | None],
    *,
    best: float,
    floor: float,
    goal: MetricGoal,
    max_retests: int = DEFAULT_MAX_RETESTS,
) -> Judgement:
    """The verdict on a candidate's runs so far (its first run, then its retests), against the kept best."""
    if not runs:
        raise ValueError("a judgement needs at least one run")
    if not (math.isfinite(floor) and floor > 0):
        raise ValueError("floor: a positive number")
    values = [value for value in runs if value is not None]
    if len(values) < len(runs):
        return Judgement(Verdict.FAILED, None, None, None, f"the run reported no value for {goal.name}")
    value = statistics.fmean(values)
    gain = goal.gain(value, best)
    threshold = floor / math.sqrt(len(values))
    measured = f"{goal.name} {_number(value)}" + (f" (mean of {len(values)} runs)" if len(values) > 1 else "")
    against = f"the best {_number(best)}"
    if gain > threshold:
        verdict, reason = Verdict.KEEP, f"{measured} beats {against} by {_number(gain)}, beyond the noise"
    elif gain <= 0:
        verdict, reason = Verdict.DISCARD, f"{measured} does not improve on {against}"
    elif len(values) - 1 < max_retests:
        verdict, reason = Verdict.RETEST, f"{measured} beats {against} by {_number(gain)}, inside the noise"
    else:
        verdict = Verdict.DISCARD
        reason = f"{measured} beats {against} by {_number(gain)}, still inside the noise after {max_retests} retests"
    return Judgement(verdict, value, gain, threshold, f"{reason} (needed more than {_number(threshold)})")


@dataclass(frozen=True)
class PendingRetest:
    """The candidate the last experiment asked to run again, and its runs so far."""

    commit: str
    runs: tuple[float, ...]


@dataclass(frozen=True)
class Signals:
    """Where the campaign stands, read from its ledger."""

    goal: MetricGoal
    rules: SignalRules
    noise: NoiseFloor | None  # from the latest baseline batch with two values or more
    best: float | None  # the kept state's value: the latest baseline mean, or a candidate kept after it
    best_commit: str
    experiments: int  # cycles that were not baseline runs
    experiments_since_keep: int
    baseline_runs_needed: int  # run the baseline this many times before the next experiment
    retest: PendingRetest | None

    @property
    def stagnant(self) -> bool:
        window = self.rules.stagnation_window
        return window > 0 and self.experiments_since_keep >= window

    @property
    def phase_gate_cleared(self) -> bool:
        bar = self.rules.phase_gate
        return bar is not None and self.best is not None and self.goal.clears(self.best, bar)

    def judge(self, commit: str, value: float | None) -> Judgement:
        """The verdict on a new run of `commit`, combined with its earlier runs when it is being retested."""
        if self.best is None or self.noise is None:
            raise ValueError("no baseline yet: measure it before judging a candidate")
        earlier = self.retest.runs if self.retest is not None and self.retest.commit == commit else ()
        floor, retests = self.noise.floor, self.rules.max_retests
        return judge((*earlier, value), best=self.best, floor=floor, goal=self.goal, max_retests=retests)

    def describe(self) -> str:
        """The signals as THINK and REFLECT read them, one per line."""
        goal, rules = self.goal, self.rules
        better = "lower" if goal.direction is MetricDirection.MINIMIZE else "higher"
        lines = [f"metric: {goal.name} ({better} is better)"]
        if self.best is not None:
            lines.append(f"best so far: {_number(self.best)} at commit {self.best_commit or '(unknown)'}")
        if self.noise is not None:
            lines.append(
                f"noise floor: {_number(self.noise.floor)} (baseline mean {_number(self.noise.mean)}, "
                f"sample std {_number(self.noise.sample_std)} over {self.noise.runs} runs); "
                "a smaller improvement is never kept on one run"
            )
        if self.baseline_runs_needed:
            lines.append(f"baseline runs needed before the next experiment: {self.baseline_runs_needed}")
        if self.retest is not None:
            runs = ", ".join(_number(run) for run in self.retest.runs)
            lines.append(f"retest pending: commit {self.retest.commit} (runs so far: {runs})")
        since = f"{self.experiments} experiments, {self.experiments_since_keep} since the last kept improvement"
        if self.stagnant:
            since += f": STAGNANT (no kept improvement in the last {rules.stagnation_window})"
        lines.append(since)
        if rules.phase_gate is not None:
            state = "CLEARED" if self.phase_gate_cleared else "not cleared"
            lines.append(f"phase gate {_number(rules.phase_gate)}: {state}")
        return "\n".join(lines)


def baseline_batches(ledger: Sequence[TrialRecord]) -> tuple[tuple[TrialRecord, ...], ...]:
    """The ledger's baseline runs in batches: a batch ends at the first run that measured a candidate.

    A failed run does not end a batch (the baseline run that crashed is simply run again).
    """
    batches: list[list[TrialRecord]] = []
    open_batch = False
    for record in ledger:
        if record.verdict is Verdict.BASELINE:
            if not open_batch:
                batches.append([])
                open_batch = True
            batches[-1].append(record)
        elif record.verdict in _MEASURED:
            open_batch = False
    return tuple(tuple(batch) for batch in batches)


def read_signals(ledger: Sequence[TrialRecord], goal: MetricGoal, rules: SignalRules) -> Signals:
    """The signals after the ledger's records (in cycle order)."""
    noise: NoiseFloor | None = None
    best: float | None = None
    best_commit = ""
    experiments = since_keep = measured_since_baseline = 0
    batch: list[float] = []
    batch_open = True  # no candidate measured since the latest baseline run (or since the start)
    retest: PendingRetest | None = None
    for record in ledger:
        value = record.metric(goal.name)
        if record.verdict is Verdict.BASELINE:
            if not batch_open:
                batch, batch_open, measured_since_baseline = [], True, 0
            if value is not None:
                batch.append(value)
                best, best_commit = statistics.fmean(batch), record.commit
                if len(batch) >= 2:
                    noise = noise_floor(batch, epsilon=rules.noise_epsilon)
            retest = None
            continue
        experiments += 1
        since_keep += 1
        if record.verdict in _MEASURED:
            batch_open = False
            measured_since_baseline += 1
        earlier = retest.runs if retest is not None and record.commit == retest.commit else ()
        if record.verdict is Verdict.KEEP and value is not None:
            best, best_commit, since_keep = statistics.fmean((*earlier, value)), record.commit, 0
        if record.verdict is Verdict.RETEST and value is not None and record.commit:
            retest = PendingRetest(record.commit, (*earlier, value))
        else:
            retest = None

    if retest is not None:
        needed = 0  # a retest is finished before the baseline is measured again
    elif batch_open:
        needed = max(rules.baseline_runs - len(batch), 0)
    elif noise is None or (rules.rebaseline_every and measured_since_baseline >= rules.rebaseline_every):
        needed = rules.baseline_runs
    else:
        needed = 0
    return Signals(goal, rules, noise, best, best_commit, experiments, since_keep, needed, retest)


def _number(value: float) -> str:
    return f"{value:.6g}"
