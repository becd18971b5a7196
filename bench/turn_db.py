"""What recording a turn costs the worker's database, on SQLite and PostgreSQL, one agent at a time and many.

    python3 bench/turn_db.py [--rounds 5] [--turns 200] [--concurrency 1,50,200]
        [--backends sqlite,postgresql] [--postgres-url postgresql://postgres@127.0.0.1:5432/test]
        [--trees before=/work/main,after=.]

A turn is what the worker's loop (quarry.agent.loop) writes for it, through the real
store (ConversationStore over quarry.db.Database, on the worker's migrated schema):
the assistant's message with its tool call, then the tool's result, two write
transactions, each awaited before the turn goes on. `--concurrency` agents run
turns at once, each on its own conversation. A no-op turn (the same two awaits,
with no database) runs in the same process beside it, so

  - db ms/turn: a turn's wall time less the no-op turn's, median over the turns;
  - db CPU ms/turn: the process's CPU time (every thread) per turn, less the no-op's.

Each tree of `--trees` (name=checkout; default: this one) is measured in a process
of its own importing quarry from that checkout, so two versions of Database are
compared within one round; rounds interleave trees and backends. Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WARM_UP_TURNS = 3


def measure(backend: str, concurrency: list[int], turns: int, postgres_url: str) -> dict[str, float]:
    """Figures for the quarry importable here (the checkout on PYTHONPATH), in this process."""
    with _database_url(backend, postgres_url) as url:
        return asyncio.run(_measure(url, concurrency, turns))


async def _measure(url: str, concurrency: list[int], turns: int) -> dict[str, float]:
    from quarry.agent.conversation import ConversationStore
    from quarry.agent.messages import ToolCall, assistant, tool_result, user
    from quarry.migrations import open_migrated_database
    from worker_svc.service import MIGRATIONS, VERSION_TABLE

    database = await open_migrated_database(url, MIGRATIONS, VERSION_TABLE)
    store = ConversationStore(database)
    call = ToolCall("call-1", "read_scratchpad", "{}")
    reply, result = assistant(tool_calls=(call,)), tool_result("call-1", "x" * 400)

    def recorded(conversation_id: str) -> Callable[[], Awaitable[Any]]:
        async def turn() -> None:
            await store.append(conversation_id, [reply])
            await store.append(conversation_id, [result])

        return turn

    async def no_op() -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    figures: dict[str, float] = {}
    try:
        for agents in concurrency:
            ids = [uuid.uuid4().hex for _ in range(agents)]
            await asyncio.gather(*(store.create(i, [user("task")]) for i in ids))
            per_agent = max(turns // agents, WARM_UP_TURNS)
            noop_ms, noop_cpu = await _run([no_op] * agents, per_agent)
            turn_ms, turn_cpu = await _run([recorded(i) for i in ids], per_agent)
            figures[f"c{agents} db ms/turn"] = turn_ms - noop_ms
            figures[f"c{agents} db CPU ms/turn"] = turn_cpu - noop_cpu
            figures[f"c{agents} turn ms"] = turn_ms
    finally:
        await database.close()
    return figures


async def _run(agents: list[Callable[[], Awaitable[Any]]], turns: int) -> tuple[float, float]:
    """(median wall ms of a turn, CPU ms per turn) over `turns` turns by each agent at once."""
    walls: list[float] = []

    async def agent(turn: Callable[[], Awaitable[Any]]) -> None:
        for _ in range(WARM_UP_TURNS):
            await turn()
        for _ in range(turns):
            start = time.perf_counter()
            await turn()
            walls.append((time.perf_counter() - start) * 1000)

    cpu = time.process_time()
    await asyncio.gather(*(agent(turn) for turn in agents))
    cpu_ms = (time.process_time() - cpu) * 1000 / (len(agents) * (turns + WARM_UP_TURNS))
    return statistics.median(walls), cpu_ms


@contextlib.contextmanager
def _database_url(backend: str, postgres_url: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as directory:
            yield f"sqlite:///{directory}/worker.db"
        return
    import psycopg
    from sqlalchemy.engine import make_url

    conninfo = make_url(postgres_url).set(drivername="postgresql").render_as_string(hide_password=False)
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield (
            make_url(postgres_url)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with psycopg.connect(conninfo, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _measured_in(tree: Path, args: argparse.Namespace, backend: str) -> dict[str, float]:
    """One measurement, by a process that imports quarry from `tree`."""
    command = [sys.executable, __file__, "--measure", backend, "--turns", str(args.turns)]
    command += ["--concurrency", args.concurrency, "--postgres-url", args.postgres_url]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"measuring {backend} in {tree} failed:\n{done.stderr}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=200, help="turns per measurement, shared by the agents")
    parser.add_argument("--concurrency", default="1,50,200")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--trees", default=f"current={ROOT}", help="name=checkout,...")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a backend: measure here, print JSON
    args = parser.parse_args()
    concurrency = [int(n) for n in args.concurrency.split(",")]
    if args.measure:
        print(json.dumps(measure(args.measure, concurrency, args.turns, args.postgres_url)))
        return
    sys.path.insert(0, str(ROOT / "bench"))
    from rounds import Rounds

    trees = {name: Path(path).resolve() for name, path in (item.split("=", 1) for item in args.trees.split(","))}
    runs = [(name, backend) for name in trees for backend in args.backends.split(",")]
    rounds = Rounds("turn_db", count=args.rounds)
    for index in rounds:
        for name, backend in rounds.order(runs, index):
            for figure, value in _measured_in(trees[name], args, backend).items():
                rounds.record(f"{backend} {figure} [{name}]", value, "ms")
    if len(trees) == 2:
        before, after = trees
        for backend in args.backends.split(","):
            for agents in concurrency:
                for figure in ("db ms/turn", "db CPU ms/turn"):
                    name = f"{backend} c{agents} {figure}"
                    rounds.ratio(f"{name} {after}/{before}", f"{name} [{after}]", f"{name} [{before}]")
    rounds.report()


if __name__ == "__main__":
    main()
