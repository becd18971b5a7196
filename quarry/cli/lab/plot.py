"""`quarry lab plot`: a campaign's metric over its experiments, as a PNG or an SVG (matplotlib, Agg: no display
needed); the campaign report embeds the SVG.

Each cycle is a point, marked by its verdict (baseline, kept, discarded, retest; a failed cycle has no
value and is a tick on the axis). The running best and the noise band around it are the signals the
campaign itself computed after each row (ListLedgerRows serves them), so the plot shows exactly the bar
each experiment had to clear.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import IO

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from quarry.v1 import campaign_pb2, monitor_pb2

# verdict -> (label, marker, colour)
_MARKS = {
    campaign_pb2.LEDGER_VERDICT_BASELINE: ("baseline", "o", "tab:blue"),
    campaign_pb2.LEDGER_VERDICT_KEEP: ("kept", "*", "tab:green"),
    campaign_pb2.LEDGER_VERDICT_DISCARD: ("discarded", "x", "tab:red"),
    campaign_pb2.LEDGER_VERDICT_RETEST: ("retest", "D", "tab:orange"),
}


def _value(row: campaign_pb2.LedgerRow, name: str) -> float | None:
    for metric in row.metrics:
        if metric.name == name:
            return metric.value if metric.HasField("value") else None
    return None


def plot_ledger(
    rows: Sequence[campaign_pb2.LedgerRow],
    metric: monitor_pb2.MetricSpec,
    path: Path | IO[bytes],
    *,
    title: str,
    image_format: str = "png",
) -> None:
    """Write the plot of the ledger's `rows` (in cycle order, each with its signals) to `path`, as a PNG or
    (`image_format="svg"`) an SVG."""
    figure = Figure(figsize=(10, 5.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for verdict, (label, marker, colour) in _MARKS.items():
        points = [(row.cycle, _value(row, metric.name)) for row in rows if row.verdict == verdict]
        shown = [(cycle, value) for cycle, value in points if value is not None]
        if shown:
            cycles, values = zip(*shown, strict=True)
            axes.scatter(cycles, values, marker=marker, s=60, color=colour, label=label, zorder=3)
    failed = [row.cycle for row in rows if row.verdict == campaign_pb2.LEDGER_VERDICT_FAILED]
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
    for row in rows:
        signals = row.signals
        if not signals.HasField("best_value"):
            continue
        best_cycles.append(row.cycle)
        best.append(signals.best_value)
        if signals.HasField("noise_floor"):
            band_cycles.append(row.cycle)
            low.append(signals.best_value - signals.noise_floor)
            high.append(signals.best_value + signals.noise_floor)
    if best:
        axes.step(best_cycles, best, where="post", color="black", linewidth=1.2, label="running best")
    if band_cycles:
        axes.fill_between(band_cycles, low, high, step="post", color="gray", alpha=0.2, label="noise band")
    better = "higher" if metric.direction == monitor_pb2.METRIC_DIRECTION_MAXIMIZE else "lower"
    axes.set_xlabel("cycle")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # cycles are whole numbers
    axes.set_ylabel(f"{metric.name} ({better} is better)")
    axes.set_title(title if rows else f"{title} (no experiments yet)")
    axes.grid(alpha=0.3)
    if rows:
        axes.legend(loc="best")
    figure.savefig(path, format=image_format, dpi=120)
