"""`quarry lab plot`: a campaign's metric over its experiments, as a PNG (matplotlib, Agg: no display needed).

Each cycle is a point, marked by its verdict (baseline, kept, discarded, retest; a failed cycle has no
value and is a tick on the axis). The running best and the noise band around it are what the campaign
itself computes from its ledger (quarry.records.signals), so the plot shows exactly the bar
each experiment had to clear.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from quarry.records.campaign import LedgerRecord, Verdict
from quarry.records.signals import Direction, MetricGoal, SignalRules, read_signals

# verdict -> (label, marker, colour)
_MARKS = {
    Verdict.BASELINE: ("baseline", "o", "tab:blue"),
    Verdict.KEEP: ("kept", "*", "tab:green"),
    Verdict.DISCARD: ("discarded", "x", "tab:red"),
    Verdict.RETEST: ("retest", "D", "tab:orange"),
}


def plot_ledger(
    ledger: Sequence[LedgerRecord], goal: MetricGoal, rules: SignalRules, path: Path, *, title: str
) -> None:
    """Write the plot of `ledger` (in cycle order) to `path` as a PNG."""
    figure = Figure(figsize=(10, 5.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for verdict, (label, marker, colour) in _MARKS.items():
        points = [(r.cycle, r.metric(goal.name)) for r in ledger if r.verdict is verdict]
        shown = [(cycle, value) for cycle, value in points if value is not None]
        if shown:
            cycles, values = zip(*shown, strict=True)
            axes.scatter(cycles, values, marker=marker, s=60, color=colour, label=label, zorder=3)
    failed = [r.cycle for r in ledger if r.verdict is Verdict.FAILED]
    if failed:
        axes.scatter(
            failed,
            [0.0] * len(failed),
            marker="|",
            s=200,
            color="tab:gray",
            label="failed (no value)",
            transform=axes.get_xaxis_transform(),  # at the bottom, whatever the values' scale
            zorder=3,
        )
    best, low, high, band_cycles, best_cycles = [], [], [], [], []
    for index, record in enumerate(ledger):
        signals = read_signals(ledger[: index + 1], goal, rules)
        if signals.best is None:
            continue
        best_cycles.append(record.cycle)
        best.append(signals.best)
        if signals.noise is not None:
            band_cycles.append(record.cycle)
            low.append(signals.best - signals.noise.floor)
            high.append(signals.best + signals.noise.floor)
    if best:
        axes.step(best_cycles, best, where="post", color="black", linewidth=1.2, label="running best")
    if band_cycles:
        axes.fill_between(band_cycles, low, high, step="post", color="gray", alpha=0.2, label="noise band")
    better = "lower" if goal.direction is Direction.MINIMIZE else "higher"
    axes.set_xlabel("cycle")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # cycles are whole numbers
    axes.set_ylabel(f"{goal.name} ({better} is better)")
    axes.set_title(title if ledger else f"{title} (no experiments yet)")
    axes.grid(alpha=0.3)
    if ledger:
        axes.legend(loc="best")
    figure.savefig(path, format="png", dpi=120)
