"""What the bubblewrap sandbox adds to a local job's launch: exec to the job's first output, sandboxed or not.

    python3 bench/sandbox_launch.py [--rounds 5] [--launches 40]

Each launch starts `echo ready` the way the monitor starts a local job (monitor_svc/jobs/local.py: a new
session, the allowlisted environment, stdin from /dev/null), once as it is and once through
Sandbox.wrap (bwrap with the monitor's default hidden paths, a writable working tree, a .git inside
it), and once sandboxed under the reaper that records its exit status (monitor_svc/jobs/reaper.py,
as the monitor launches every local job), and times from just before the exec to the first byte of
its output. The two ways alternate
launch by launch, in `rounds` rounds of `launches` each, the way that goes first in each pair
rotating between rounds (bench/rounds.py). Prints each round's p50 and p99 of each way, the extra p50
(sandboxed minus plain) and the sandboxed / plain p50 ratio, both taken within a round, as the median
(range) over rounds with the load average of each round. Figures only.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from harness import arguments, percentile
from rounds import MIN_ROUNDS, Rounds

from monitor_svc.jobs import reaper
from monitor_svc.jobs.local import REAPER_FLAGS
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


async def main() -> None:
    args = arguments(__doc__ or "", rounds=MIN_ROUNDS, launches=40)
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
        reaped = (sys.executable, *REAPER_FLAGS, str(Path(reaper.__file__)), str(root / "job.exit"), *boxed.argv)
        ways = {"plain": bare.argv, "sandboxed": boxed.argv, "sandboxed, reaped": reaped}
        environments = {
            "plain": bare.environment,
            "sandboxed": boxed.environment,
            "sandboxed, reaped": boxed.environment,
        }
        rounds = Rounds("sandbox_launch", args.rounds)
        for index in rounds:
            order = rounds.order(list(ways), index)
            launches: dict[str, list[float]] = {way: [] for way in ways}
            for _ in range(args.launches):
                for way in order:
                    launches[way].append(await first_output(ways[way], environments[way], str(work)) * 1000)
            for way, values in launches.items():
                rounds.record(f"{way} p50", percentile(values, 0.5), "ms")
                rounds.record(f"{way} p99", percentile(values, 0.99), "ms")
            rounds.record(
                "extra p50", percentile(launches["sandboxed"], 0.5) - percentile(launches["plain"], 0.5), "ms"
            )
            rounds.record(
                "reaper extra p50",
                percentile(launches["sandboxed, reaped"], 0.5) - percentile(launches["sandboxed"], 0.5),
                "ms",
            )
    rounds.ratio("sandboxed / plain p50", "sandboxed p50", "plain p50")
    print(f"{sandbox.describe()}; {args.launches} launches each way a round, interleaved; exec to first output")
    rounds.report()


if __name__ == "__main__":
    asyncio.run(main())
