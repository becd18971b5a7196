"""Signals from the ledger: the noise floor, the verdict rules, the best so far, stagnation and the phase gate."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quarry.records.campaign import Verdict
from quarry.records.signals import (
    MetricGoal,
    SignalRules,
    baseline_batches,
    judge,
    noise_floor,
    read_signals,
)
from quarry.vocabulary import MetricDirection
from tests.supervisor_svc.campaigns.ledger import LOSS, baseline, run

ACCURACY = MetricGoal("accuracy", MetricDirection.MAXIMIZE)
MAXIMIZED = [(1, Verdict.BASELINE, 0.8), (2, Verdict.BASELINE, 0.82), (3, Verdict.KEEP, 0.91)]
RULES = SignalRules(stagnation_window=3, rebaseline_every=4, phase_gate=0.40)
# Three baseline runs of val_loss: mean 0.50, sample std 0.01, so the noise floor is 0.02.
BASELINE = baseline(1, 0.49, 0.50, 0.51)

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
positive = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False)


# -- the noise floor -----------------------------------------------------------------------------


def test_the_floor_is_twice_the_sample_standard_deviation() -> None:
    floor = noise_floor([0.49, 0.50, 0.51])
    assert floor.floor == pytest.approx(0.02)
    assert floor.sample_std == pytest.approx(0.01)
    assert floor.mean == pytest.approx(0.50)
    assert floor.runs == 3


def test_identical_runs_leave_the_epsilon_as_the_floor() -> None:
    assert noise_floor([0.5, 0.5, 0.5], epsilon=1e-3).floor == 1e-3


def test_a_floor_needs_two_runs() -> None:
    with pytest.raises(ValueError, match="two"):
        noise_floor([0.5])


# -- judging a candidate -------------------------------------------------------------------------


def test_an_improvement_beyond_the_floor_is_kept() -> None:
    judgement = judge([0.47], best=0.50, floor=0.02, goal=LOSS)
    assert judgement.verdict is Verdict.KEEP
    assert judgement.value == 0.47
    assert judgement.gain == pytest.approx(0.03)
    assert "beyond the noise" in judgement.reason


def test_a_single_run_inside_the_floor_is_retested_not_kept() -> None:
    judgement = judge([0.49], best=0.50, floor=0.02, goal=LOSS)
    assert judgement.verdict is Verdict.RETEST
    assert "inside the noise" in judgement.reason


def test_retests_are_bounded_then_the_candidate_is_discarded() -> None:
    assert judge([0.49, 0.495], best=0.50, floor=0.02, goal=LOSS, max_retests=2).verdict is Verdict.RETEST
    judgement = judge([0.49, 0.495, 0.49], best=0.50, floor=0.02, goal=LOSS, max_retests=2)
    assert judgement.verdict is Verdict.DISCARD
    assert "after 2 retests" in judgement.reason
    assert judge([0.49], best=0.50, floor=0.02, goal=LOSS, max_retests=0).verdict is Verdict.DISCARD


def test_retests_are_combined_by_their_mean_against_a_floor_shrinking_with_the_runs() -> None:
    # A gain of 0.015 is inside the one-run floor 0.02 but beyond 0.02 / sqrt(2) for a mean of two runs.
    judgement = judge([0.485, 0.485], best=0.50, floor=0.02, goal=LOSS)
    assert judgement.verdict is Verdict.KEEP
    assert judgement.value == pytest.approx(0.485)
    assert judgement.threshold == pytest.approx(0.02 / math.sqrt(2))
    # A lucky first run does not carry a poor retest: the mean is what counts.
    assert judge([0.47, 0.53], best=0.50, floor=0.02, goal=LOSS).verdict is Verdict.DISCARD


@pytest.mark.parametrize("value", [0.50, 0.55])
def test_no_improvement_or_a_regression_is_discarded(value: float) -> None:
    judgement = judge([value], best=0.50, floor=0.02, goal=LOSS)
    assert judgement.verdict is Verdict.DISCARD
    assert "does not improve" in judgement.reason


def test_a_run_without_a_value_failed() -> None:
    judgement = judge([0.47, None], best=0.50, floor=0.02, goal=LOSS)
    assert judgement.verdict is Verdict.FAILED
    assert judgement.value is None
    assert "val_loss" in judgement.reason


def test_maximizing_keeps_what_goes_up() -> None:
    assert judge([0.93], best=0.90, floor=0.02, goal=ACCURACY).verdict is Verdict.KEEP
    assert judge([0.87], best=0.90, floor=0.02, goal=ACCURACY).verdict is Verdict.DISCARD


@pytest.mark.parametrize(("runs", "floor"), [([], 0.02), ([0.4], 0.0), ([0.4], math.nan)])
def test_judge_refuses_what_it_cannot_judge(runs: list[float], floor: float) -> None:
    with pytest.raises(ValueError):
        judge(runs, best=0.5, floor=floor, goal=LOSS)


@settings(max_examples=300, deadline=None)
@given(value=finite, best=finite, floor=positive)
def test_one_run_inside_the_noise_is_never_kept(value: float, best: float, floor: float) -> None:
    judgement = judge([value], best=best, floor=floor, goal=LOSS)
    assert (judgement.verdict is Verdict.KEEP) == (best - value > floor)


@settings(max_examples=300, deadline=None)
@given(runs=st.lists(finite, min_size=1, max_size=4), best=finite, floor=positive)
def test_a_kept_mean_beats_the_best_by_more_than_the_floor_for_its_runs(
    runs: list[float], best: float, floor: float
) -> None:
    judgement = judge(runs, best=best, floor=floor, goal=LOSS, max_retests=3)
    if judgement.verdict is Verdict.KEEP:
        assert best - statistics.fmean(runs) > floor / math.sqrt(len(runs))
    assert judgement.verdict is not Verdict.FAILED


@settings(max_examples=300, deadline=None)
@given(runs=st.lists(finite, min_size=1, max_size=4), best=finite, floor=positive)
def test_maximizing_is_minimizing_the_negated_metric(runs: list[float], best: float, floor: float) -> None:
    minimized = judge(runs, best=best, floor=floor, goal=LOSS)
    maximized = judge([-run for run in runs], best=-best, floor=floor, goal=ACCURACY)
    assert minimized.verdict is maximized.verdict


@settings(max_examples=200, deadline=None)
@given(runs=st.lists(finite, min_size=4, max_size=4), best=finite, floor=positive, retests=st.integers(0, 3))
def test_a_candidate_is_settled_within_its_retests(runs: list[float], best: float, floor: float, retests: int) -> None:
    verdicts = [judge(runs[: n + 1], best=best, floor=floor, goal=LOSS, max_retests=retests).verdict for n in range(4)]
    settled = verdicts.index(next(v for v in verdicts if v is not Verdict.RETEST))
    assert settled <= retests


# -- reading the ledger --------------------------------------------------------------------------


def test_a_fresh_campaign_needs_its_baseline_first() -> None:
    signals = read_signals([], LOSS, RULES)
    assert signals.baseline_runs_needed == 3
    assert signals.best is None
    assert signals.noise is None
    with pytest.raises(ValueError, match="baseline"):
        signals.judge("c001", 0.4)


def test_the_baseline_batch_is_counted_down_then_sets_the_best_and_the_floor() -> None:
    assert read_signals(BASELINE[:2], LOSS, RULES).baseline_runs_needed == 1
    signals = read_signals(BASELINE, LOSS, RULES)
    assert signals.baseline_runs_needed == 0
    assert signals.best == pytest.approx(0.50)
    assert signals.best_commit == "base"
    assert signals.noise is not None
    assert signals.noise.floor == pytest.approx(0.02)
    assert signals.experiments == 0


def test_a_failed_baseline_run_is_run_again_within_the_same_batch() -> None:
    ledger = [*BASELINE[:2], run(3, Verdict.FAILED), *baseline(4, 0.51)]
    assert [len(batch) for batch in baseline_batches(ledger)] == [3]
    assert read_signals(ledger[:3], LOSS, RULES).baseline_runs_needed == 1
    assert read_signals(ledger, LOSS, RULES).baseline_runs_needed == 0


def test_a_kept_candidate_becomes_the_best() -> None:
    ledger = [*BASELINE, run(4, Verdict.DISCARD, 0.52), run(5, Verdict.KEEP, 0.46, commit="k5")]
    signals = read_signals(ledger, LOSS, RULES)
    assert signals.best == 0.46
    assert signals.best_commit == "k5"
    assert signals.experiments == 2
    assert signals.experiments_since_keep == 0


def test_a_retest_is_judged_with_its_earlier_runs_and_kept_at_their_mean() -> None:
    ledger = [*BASELINE, run(4, Verdict.RETEST, 0.485, commit="r")]
    signals = read_signals(ledger, LOSS, RULES)
    assert signals.retest is not None
    assert signals.retest.runs == (0.485,)
    assert signals.baseline_runs_needed == 0
    judgement = signals.judge("r", 0.485)
    assert judgement.verdict is Verdict.KEEP
    # Another commit is a new candidate: its one run inside the noise is retested, not kept.
    assert signals.judge("other", 0.485).verdict is Verdict.RETEST
    kept = read_signals([*ledger, run(5, Verdict.KEEP, 0.475, commit="r")], LOSS, RULES)
    assert kept.best == pytest.approx(0.48)
    assert kept.retest is None


def test_the_baseline_is_measured_again_every_so_many_experiments_and_replaces_the_best() -> None:
    experiments = [run(4 + index, Verdict.DISCARD, 0.52) for index in range(3)]
    assert read_signals([*BASELINE, *experiments], LOSS, RULES).baseline_runs_needed == 0
    kept = run(7, Verdict.KEEP, 0.44, commit="k7")
    due = read_signals([*BASELINE, *experiments, kept], LOSS, RULES)
    assert due.baseline_runs_needed == 3
    assert due.best == 0.44
    # Measured again, the kept state is worse than its lucky run: the new batch is the truth, floor included.
    again = baseline(8, 0.45, 0.47, 0.49, commit="k7")
    signals = read_signals([*BASELINE, *experiments, kept, *again], LOSS, RULES)
    assert signals.baseline_runs_needed == 0
    assert signals.best == pytest.approx(0.47)
    assert signals.best_commit == "k7"
    assert signals.noise is not None
    assert signals.noise.floor == pytest.approx(0.04)
    assert len(baseline_batches([*BASELINE, *experiments, kept, *again])) == 2


def test_without_rebaselining_the_baseline_is_measured_once() -> None:
    rules = SignalRules(rebaseline_every=0)
    experiments = [run(4 + index, Verdict.DISCARD, 0.52) for index in range(50)]
    assert read_signals([*BASELINE, *experiments], LOSS, rules).baseline_runs_needed == 0


def test_stagnation_is_a_window_of_experiments_without_a_kept_improvement() -> None:
    ledger = [*BASELINE, run(4, Verdict.KEEP, 0.46), run(5, Verdict.DISCARD, 0.5), run(6, Verdict.FAILED)]
    assert not read_signals(ledger, LOSS, RULES).stagnant
    stagnant = read_signals([*ledger, run(7, Verdict.RETEST, 0.45)], LOSS, RULES)
    assert stagnant.experiments_since_keep == 3
    assert stagnant.stagnant
    assert "STAGNANT" in stagnant.describe()
    assert not read_signals([*ledger, run(7, Verdict.DISCARD, 0.5)], LOSS, SignalRules(stagnation_window=0)).stagnant


def test_the_phase_gate_opens_when_the_best_clears_the_bar() -> None:
    assert not read_signals(BASELINE, LOSS, RULES).phase_gate_cleared
    cleared = read_signals([*BASELINE, run(4, Verdict.KEEP, 0.40)], LOSS, RULES)
    assert cleared.phase_gate_cleared
    assert "phase gate 0.4: CLEARED" in cleared.describe()
    assert not read_signals([*BASELINE, run(4, Verdict.KEEP, 0.40)], LOSS, SignalRules()).phase_gate_cleared
    accuracy = SignalRules(phase_gate=0.9)
    ledger = [run(cycle, verdict, value, metric="accuracy") for cycle, verdict, value in MAXIMIZED]
    assert read_signals(ledger[:2], ACCURACY, accuracy).phase_gate_cleared is False
    assert read_signals(ledger, ACCURACY, accuracy).phase_gate_cleared


def test_the_description_says_what_think_must_know() -> None:
    text = read_signals([*BASELINE, run(4, Verdict.RETEST, 0.49, commit="r")], LOSS, RULES).describe()
    assert "val_loss (lower is better)" in text
    assert "best so far: 0.5 at commit base" in text
    assert "noise floor: 0.02" in text
    assert "retest pending: commit r (runs so far: 0.49)" in text
    assert "1 experiments, 1 since the last kept improvement" in text
    assert "phase gate 0.4: not cleared" in text
    assert "baseline runs needed before the next experiment: 3" in read_signals([], LOSS, RULES).describe()


@pytest.mark.parametrize(
    "settings_",
    [
        {"baseline_runs": 1},
        {"max_retests": -1},
        {"noise_epsilon": 0.0},
        {"noise_epsilon": math.inf},
        {"phase_gate": math.nan},
    ],
)
def test_rules_are_checked_when_made(settings_: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SignalRules(**settings_)  # type: ignore[arg-type]
