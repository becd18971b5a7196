"""How long the `quarry` command takes to start: its help, and a client command's whole life to its first RPC.

    python3 bench/cli_startup.py [--runs 10] [--rounds 5]

Starts a scratchpad and a supervisor (`quarry serve`, SQLite, on free ports), then in each round runs, in
an order that rotates, `runs` times each:
  - `python3 -c pass`: the interpreter alone, the floor under every command;
  - `quarry --help`;
  - `quarry runs list --address ADDR`: parse, load the settings, connect, check health, call ListRuns once,
    print the (empty) table, exit: a client command to its first RPC and past it.
Each figure is the median over the round's runs of the wall time (the process's start to its exit) and of
the CPU time it used (user + system, from the children's resource usage). Prints figures only.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from harness import arguments, mesh_environment, running_service
from rounds import MIN_ROUNDS, Rounds

from quarry.identity import MeshRole


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of the command, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    args: argparse.Namespace = arguments(__doc__, runs=10, rounds=MIN_ROUNDS)
    rounds = Rounds("cli_startup", args.rounds)
    with tempfile.TemporaryDirectory() as workdir_name, ExitStack() as stack:
        workdir = Path(workdir_name)
        common = {"QUARRY_DATA_DIR": str(workdir / "data"), "QUARRY_LOG_LEVEL": "WARNING"}
        scratchpad_env = {
            **common,
            **mesh_environment(None),
            "QUARRY_SCRATCHPAD_DATABASE_URL": f"sqlite:///{workdir / 'scratchpad.db'}",
        }
        _, scratchpad = stack.enter_context(running_service("scratchpad", scratchpad_env, workdir))
        supervisor_env = {
            **common,
            **mesh_environment(MeshRole.SUPERVISOR),
            "QUARRY_SUPERVISOR_DATABASE_URL": f"sqlite:///{workdir / 'supervisor.db'}",
            "QUARRY_SUPERVISOR_SCRATCHPAD_ADDRESS": scratchpad,
        }
        _, supervisor = stack.enter_context(running_service("supervisor", supervisor_env, workdir))
        env = {**os.environ, **common}
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "quarry --help": [sys.executable, "-m", "quarry", "--help"],
            "quarry runs list (first RPC)": [sys.executable, "-m", "quarry", "runs", "list", "--address", supervisor],
        }
        for index in rounds:
            for label in rounds.order(list(commands), index):
                walls, cpus = zip(*(timed(commands[label], env) for _ in range(args.runs)), strict=True)
                rounds.record(f"{label} wall", statistics.median(walls) * 1000, "ms")
                rounds.record(f"{label} CPU", statistics.median(cpus) * 1000, "ms")
    rounds.ratio("--help / the interpreter alone, wall", "quarry --help wall", "python -c pass wall")
    print(f"{args.runs} runs of each command a round; {os.cpu_count()} CPUs")
    rounds.report()


if __name__ == "__main__":
    main()
