"""Rerun every benchmark that docs/benchmarks.md reports, and print its figures beside the documented ones.

    python3 bench/all.py [--only compare,run,...] [--list]

Runs each bench below with the command docs/benchmarks.md gives, one after the
other, collecting the `FIGURE` lines bench/rounds.py prints. The documented
figures are the rows of docs/benchmarks.md whose first cell is a figure's key in
backticks (`compare/quarry / openai at p50`) and whose second is its
`median (low-high)`. Prints one table: each figure's documented median and
range, this run's, and whether this run's median lies inside the documented
range ("-" where a figure is not documented); then the figures documented but
not printed (a stale row). Exit status 1 when a bench fails.
All of it takes under 30 minutes on the 2-core machine; bench/retrieval.py needs Debian's
postgresql-doc-15 (the manual it searches).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"

# Each bench with its documented command line (docs/benchmarks.md gives the same).
BENCHES: dict[str, list[str]] = {
    "compare": ["bench/compare.py", "--delegations", "60"],
    "worker": ["bench/worker.py"],
    "http_pool": ["bench/http_pool.py"],
    "turn_db": ["bench/turn_db.py"],
    "scratchpad": ["bench/scratchpad.py"],
    "run": ["bench/run.py", "--hops", "30"],
    "tracing": ["bench/tracing.py"],
    "resume": ["bench/resume.py"],
    "replay": ["bench/replay.py"],
    "api_auth": ["bench/api_auth.py"],
    "sandbox_launch": ["bench/sandbox_launch.py"],
    "retrieval": ["bench/retrieval.py"],
    "retrieval_synthetic": ["bench/retrieval_synthetic.py"],
    "campaign": ["bench/campaign.py"],
    "gpu_sharing": ["bench/gpu_sharing.py"],
    "cli_startup": ["bench/cli_startup.py"],
}

# | `bench/figure` | median (low-high) ... ; the range's dash may be an en dash.
_ROW = re.compile(
    r"^\|\s*`(?P<key>[^`]+/[^`]+)`\s*\|\s*(?P<median>[-\d.,]+)\s*\((?P<low>[-\d.,]+)[-\u2013](?P<high>[-\d.,]+)\)"
)


@dataclass(frozen=True)
class Figure:
    median: float
    low: float
    high: float
    unit: str = ""


def documented(text: str) -> dict[str, Figure]:
    """The figures docs/benchmarks.md states, by key."""
    figures = {}
    for line in text.splitlines():
        match = _ROW.match(line)
        if match:
            median, low, high = (float(match[name].replace(",", "")) for name in ("median", "low", "high"))
            figures[match["key"]] = Figure(median, low, high)
    return figures


def printed(output: str) -> dict[str, Figure]:
    """The figures a bench printed as FIGURE lines, by key."""
    figures = {}
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) == 6 and parts[0] == "FIGURE":
            figures[parts[1]] = Figure(float(parts[2]), float(parts[3]), float(parts[4]), parts[5])
    return figures


def run_bench(name: str, command: list[str], log_dir: Path) -> tuple[dict[str, Figure], bool, float]:
    started = time.monotonic()
    print(f"== {name}: python3 {' '.join(command)}", flush=True)
    result = subprocess.run(
        [sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=20 * 60, check=False
    )
    elapsed = time.monotonic() - started
    (log_dir / f"{name}.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        print(f"   failed (exit {result.returncode}); the last lines:\n{result.stderr[-2000:]}", flush=True)
    return printed(result.stdout), result.returncode == 0, elapsed


def table(measured: dict[str, Figure], docs: dict[str, Figure]) -> list[str]:
    lines = ["| figure | documented | this run | inside the documented range |", "| --- | --- | --- | --- |"]
    for key, now in measured.items():
        before = docs.get(key)
        then = "-" if before is None else f"{_n(before.median)} ({_n(before.low)}-{_n(before.high)})"
        inside = "-" if before is None else ("yes" if before.low <= now.median <= before.high else "NO")
        lines.append(f"| `{key}` | {then} | {_n(now.median)} ({_n(now.low)}-{_n(now.high)}) {now.unit} | {inside} |")
    return lines


def _n(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated bench names (default: all)")
    parser.add_argument("--list", action="store_true", help="print the benches and their commands, run nothing")
    parser.add_argument("--logs", default="bench-logs", help="folder for each bench's full output")
    args = parser.parse_args()
    chosen = [name for name in args.only.split(",") if name] or list(BENCHES)
    unknown = sorted(set(chosen) - set(BENCHES))
    if unknown:
        raise SystemExit(f"unknown benches: {', '.join(unknown)}; known: {', '.join(BENCHES)}")
    if args.list:
        for name in chosen:
            print(f"{name}: python3 {' '.join(BENCHES[name])}")
        return
    log_dir = Path(args.logs)
    log_dir.mkdir(parents=True, exist_ok=True)
    docs = documented(DOCS.read_text())
    measured: dict[str, Figure] = {}
    failed, times = [], {}
    for name in chosen:
        figures, ok, times[name] = run_bench(name, BENCHES[name], log_dir)
        measured.update(figures)
        if not ok:
            failed.append(name)
    print("\n".join(["", *table(measured, docs)]))
    ran = tuple(f"{name}/" for name in chosen)
    stale = [key for key in docs if key.startswith(ran) and key not in measured]
    if stale:
        print("\ndocumented but not printed by this run: " + ", ".join(f"`{key}`" for key in stale))
    print("\nminutes per bench: " + ", ".join(f"{name} {seconds / 60:.1f}" for name, seconds in times.items()))
    print(f"total {sum(times.values()) / 60:.1f} minutes; full output under {log_dir}/")
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
