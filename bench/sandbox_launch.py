"""What the bubblewrap sandbox adds to a local job's launch: exec to the job's first output, sandboxed or not.

    python3 bench/sandbox_launch.py [--rounds 5] [--launches 40]

Each launch starts `echo ready` the way the monitor starts a local job (monitor_svc/jobs/local.py: a new
session, the allowlisted environment, stdin from /dev/null), once as it is and once through
Sandbox.wrap (bwrap with the monitor's default hidden paths, a writable working tree, a .git inside
it), and times from just before the exec to the first byte of its output. The two ways alternate
launch by launch, in `rounds` rounds of `launches` each. Prints each round's p50 and p99 of each way,
and the extra p50 (sandboxed minus plain), as the median (range) over rounds. Figures only.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import arguments, percentile

from monitor_svc.jobs.sandbox import SECRET_DIRECTORIES, Sandbox

COMMAND = ("/bin/echo", "ready")


async def first_output(argv: tuple[str, ...], environment: dict[str, str], cwd: str) -> float:
    """Seconds from the exec to the first byte the job writes; the job is then waited for."""
    began = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    assert process.stdout is not None
    first = await process.stdout.read(1)
    seconds = time.perf_counter() - began
    rest = await process.stdout.read()
    if await process.wait() != 0 or first + rest != b"ready\n":
        raise RuntimeError(f"{argv[0]} failed: {(first + rest).decode(errors='replace')}")
    return seconds


def spread(values: list[float]) -> str:
    """Median (range) of per-round figures, in milliseconds."""
    return f"{statistics.median(values) * 1000:.1f} ms ({min(values) * 1000:.1f}-{max(values) * 1000:.1f})"


async def main() -> None:
    args = arguments(__doc__ or "", rounds=5, launches=40)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (work := root / "work").mkdir()
        (work / ".git").mkdir()
        (data := root / "data").mkdir()
        sandbox = Sandbox("bwrap", False, [str(data), str(data / "jobs"), "~/.ssh", *SECRET_DIRECTORIES])
        sandbox.probe()
        if not sandbox.describe().startswith("bubblewrap"):
            sys.exit(f"no sandbox here: {sandbox.describe()}")
        boxed, bare = (
            way.wrap(
                COMMAND, writable=str(work), working_directory=str(work), gpus=(), environment={}, isolate_network=False
            )
            for way in (sandbox, Sandbox("none", True, []))
        )
        # Per round: each way's p50 and p99, and the sandbox's extra p50.
        figures: dict[str, list[float]] = {name: [] for name in ("plain p50", "plain p99", "sandboxed p50")}
        figures |= {"sandboxed p99": [], "extra p50": []}
        for _ in range(args.rounds):
            rounds: dict[str, list[float]] = {"plain": [], "sandboxed": []}
            for _ in range(args.launches):
                rounds["plain"].append(await first_output(bare.argv, bare.environment, str(work)))
                rounds["sandboxed"].append(await first_output(boxed.argv, boxed.environment, str(work)))
            for way, values in rounds.items():
                figures[f"{way} p50"].append(percentile(values, 0.5))
                figures[f"{way} p99"].append(percentile(values, 0.99))
            figures["extra p50"].append(figures["sandboxed p50"][-1] - figures["plain p50"][-1])
    print(f"{sandbox.describe()}; {args.rounds} rounds of {args.launches} launches each way, interleaved")
    print("exec to first output, median (range) over rounds:")
    for name, values in figures.items():
        print(f"  {name:<14} {spread(values)}")


if __name__ == "__main__":
    asyncio.run(main())
