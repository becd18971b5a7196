"""Figures measured in several interleaved rounds, reported as median (range) with the load beside each round.

A benchmark runs every contender once per round, in an order that rotates from
round to round, so the machine's drift touches each alike; a ratio is taken
within a round (both sides measured minutes apart at most) and then summarised
over the rounds. Besides its table, `report` prints one tab-separated line per
figure, `FIGURE <bench>/<figure> <median> <low> <high> <unit>`, that bench/all.py
collects.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

_T = TypeVar("_T")

MIN_ROUNDS = 5


@dataclass
class Rounds:
    bench: str
    count: int = MIN_ROUNDS
    values: dict[str, list[float]] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)
    _ratios: list[tuple[str, str, str]] = field(default_factory=list)

    def __iter__(self) -> Iterator[int]:
        for index in range(self.count):
            load = os.getloadavg()[0]
            self.loads.append(load)
            print(f"-- round {index + 1}/{self.count} (load average {load:.2f})", flush=True)
            yield index

    @staticmethod
    def order(items: Sequence[_T], index: int) -> list[_T]:
        """`items` rotated by the round's index: each goes first in turn."""
        shift = index % len(items) if items else 0
        return [*items[shift:], *items[:shift]]

    def record(self, figure: str, value: float, unit: str = "") -> None:
        self.values.setdefault(figure, []).append(value)
        self.units.setdefault(figure, unit)

    def ratio(self, figure: str, numerator: str, denominator: str) -> None:
        """Report numerator / denominator, divided within each round."""
        self._ratios.append((figure, numerator, denominator))

    def _with_ratios(self) -> dict[str, list[float]]:
        values = dict(self.values)
        for figure, numerator, denominator in self._ratios:
            pairs = zip(self.values.get(numerator, []), self.values.get(denominator, []), strict=False)
            values[figure] = [top / bottom for top, bottom in pairs if bottom]
            self.units.setdefault(figure, "x")
        return values

    def report(self) -> None:
        values = self._with_ratios()
        loads = ", ".join(f"{load:.2f}" for load in self.loads)
        print(f"\n{self.bench}: median (range) over {len(self.loads)} rounds; load average per round: {loads}")
        width = max((len(name) for name in values), default=10)
        for figure, series in values.items():
            if not series:
                continue
            unit = self.units.get(figure, "")
            rounds = " ".join(_number(value) for value in series)
            print(f"  {figure:<{width}}  {summary(series)} {unit}   [{rounds}]")
        for figure, series in values.items():
            if series:
                middle, low, high = statistics.median(series), min(series), max(series)
                unit = self.units.get(figure, "")
                print(f"FIGURE\t{self.bench}/{figure}\t{middle:.6g}\t{low:.6g}\t{high:.6g}\t{unit}")


def summary(series: Sequence[float]) -> str:
    """`median (low-high)` of a series."""
    return f"{_number(statistics.median(series))} ({_number(min(series))}-{_number(max(series))})"


def _number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
