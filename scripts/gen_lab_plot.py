"""Regenerate docs/images/lab-plot.png, the README's picture of `quarry lab plot`.

A small, realistic campaign ledger is simulated: a training script whose validation loss has a true value
per commit and a little measurement noise, and a sequence of changes (some better, some worse, one inside
the noise, one that crashes). Every verdict comes from the campaign's own signals (read_signals, judge),
and the picture from the real plot code (quarry.cli.lab.plot) over the rows ListLedgerRows would serve, so it
shows what a campaign would.

    python3 scripts/gen_lab_plot.py [output.png]
"""

from __future__ import annotations

import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from quarry.cli.lab.plot import plot_ledger
from quarry.records.campaign import TrialRecord, Verdict
from quarry.records.contract import ledger_rows
from quarry.records.signals import MetricGoal, SignalRules, read_signals
from quarry.v1 import monitor_pb2
from quarry.vocabulary import JobState, MetricDirection

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "images" / "lab-plot.png"
GOAL = MetricGoal("val_loss", MetricDirection.MINIMIZE)
RULES = SignalRules(rebaseline_every=8)
NOISE = 0.012  # the run-to-run spread of the metric
BASELINE_LOSS = 2.31
MAX_CYCLES = 100  # the changes, their retests and the baseline runs take far fewer
# Each change's true effect on the kept state's loss; None: the experiment crashes.
CHANGES: list[tuple[str, float | None]] = [
    ("cosine learning-rate schedule", -0.21),
    ("batch size 64 -> 128", +0.08),
    ("dropout 0.1 -> 0.2", -0.004),
    ("warm-up over 500 steps", -0.12),
    ("gradient clipping at 1.0", None),
    ("weight decay 0.01 -> 0.05", +0.03),
    ("label smoothing 0.1", -0.09),
    ("two more layers", +0.15),
    ("AdamW betas (0.9, 0.95)", -0.06),
    ("learning rate x2", +0.22),
    ("tied embeddings", -0.005),
    ("EMA of the weights", -0.07),
    ("mixed precision (bf16)", None),
]


def simulated_ledger(seed: int = 7) -> list[TrialRecord]:
    noise = random.Random(seed)
    truth = {"c0": BASELINE_LOSS}  # each commit's true loss
    ledger: list[TrialRecord] = []
    changes = iter(CHANGES)
    start = datetime(2026, 12, 1, 22, 0, tzinfo=UTC)
    for _ in range(MAX_CYCLES):
        signals = read_signals(ledger, GOAL, RULES)
        kept = signals.best_commit or "c0"
        crashes = False
        if signals.baseline_runs_needed:
            commit, hypothesis = kept, "baseline"
        elif signals.retest is not None:
            commit, hypothesis = signals.retest.commit, "retest"
        else:
            change = next(changes, None)
            if change is None:
                return ledger
            hypothesis, delta = change
            commit, crashes = f"c{len(ledger) + 1}", delta is None
            truth[commit] = truth[kept] + (delta or 0.0)
        value = None if crashes else truth[commit] + noise.gauss(0.0, NOISE)
        verdict = Verdict.BASELINE if signals.baseline_runs_needed else signals.judge(commit, value).verdict
        began = start + timedelta(minutes=6 * len(ledger))
        ledger.append(
            TrialRecord(
                cycle=len(ledger) + 1,
                hypothesis=hypothesis,
                action=hypothesis,
                commit=commit,
                job_id=f"job-{len(ledger) + 1}",
                job_state=JobState.FAILED if value is None else JobState.COMPLETED,
                exit_code=1 if value is None else 0,
                metrics={GOAL.name: value},
                verdict=verdict,
                started_at=began,
                ended_at=began + timedelta(minutes=5),
            )
        )
    raise AssertionError(f"the changes were not all tried within {MAX_CYCLES} cycles")


def main() -> None:
    output = Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT
    rows = ledger_rows(simulated_ledger(), GOAL, RULES)
    metric = monitor_pb2.MetricSpec(name=GOAL.name, direction=monitor_pb2.METRIC_DIRECTION_MINIMIZE)
    plot_ledger(rows, metric, output, title="tiny-lm: lower the validation loss (simulated)")
    print(f"wrote {output} ({output.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
