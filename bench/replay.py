"""What recording costs a run: time per model turn, and the storage a run's recording takes.

    python3 bench/replay.py [--rounds 5] [--turns 100] [--history 20] [--delay 0.0]

Per turn: quarry.agent.model.ModelClient.complete against a minimal OpenAI-compatible SSE server in a
process of its own (bench/http_pool.py's, answering after `delay` seconds: 0 shows recording's whole
cost, a model's latency shows its share of a turn), with a conversation of `history` messages (400 characters
each, one more per turn, as an agent's grows), inside a run's recording scope (quarry.recording, into a
migrated worker database on SQLite) and outside one. Each round runs both, in rotating order, `turns`
turns each; reported: wall ms per turn (median over the turns) each way, and their ratio per round.
Storage per turn: what the recording tables grew by over the recorded turns, per turn.

Storage per run: for each recorded fixture (tests/replays/*.qrun), its exchanges, the bytes of its distinct
bodies (what the run's recording adds to the databases, less row overhead), and the .qrun file's size.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from harness import arguments
from rounds import Rounds

from quarry.agent.messages import Message, assistant, user
from quarry.agent.model import ModelClient, ModelSettings
from quarry.migrations import open_migrated_database
from quarry.recording import Recordings, RecordingStore, recording
from quarry.replay.qrun import read
from worker_svc.service import MIGRATIONS, VERSION_TABLE

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "replays"


async def turns(client: ModelClient, history: list[Message], count: int) -> list[float]:
    """Wall ms of each of `count` turns, the conversation growing by one message a turn."""
    conversation = list(history)
    times = []
    for turn in range(count):
        conversation.append(user(f"turn {turn}: " + "y" * 390))
        started = time.perf_counter()
        reply = await client.complete(conversation, call_id_prefix=f"t{turn}")
        times.append((time.perf_counter() - started) * 1000)
        conversation.append(assistant(reply.message.content))
    return times


async def stored_bytes(database_url: str) -> int:
    database = await open_migrated_database(database_url, MIGRATIONS, VERSION_TABLE)
    try:
        return int(
            await database.read(
                lambda connection: (
                    connection.exec_driver_sql("SELECT coalesce(sum(length(body)), 0) FROM recorded_blobs").scalar()
                    + connection.exec_driver_sql(
                        "SELECT coalesce(sum(length(request) + length(headers) + length(url)), 0) "
                        "FROM recorded_exchanges"
                    ).scalar()
                )
            )
        )
    finally:
        await database.close()


async def main_async(rounds_count: int, count: int, history_length: int, delay: float) -> None:
    command = [sys.executable, str(ROOT / "bench" / "http_pool.py"), "--serve", "1", "--delay", str(delay)]
    server = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert server.stdout is not None and server.stdin is not None
    history = [user("q" * 400) if n % 2 == 0 else assistant("a" * 400) for n in range(history_length)]
    try:
        port = int(await asyncio.wait_for(server.stdout.readline(), 30))
        client = ModelClient(ModelSettings(base_url=f"http://127.0.0.1:{port}/v1", model="bench"))
        rounds = Rounds("replay", count=rounds_count)
        with tempfile.TemporaryDirectory() as workdir:
            url = f"sqlite:///{workdir}/worker.db"
            database = await open_migrated_database(url, MIGRATIONS, VERSION_TABLE)
            recordings = Recordings(RecordingStore(database))
            await turns(client, history, 5)  # warm the connection and the code paths
            for index in rounds:
                for recorded in rounds.order([False, True], index):
                    before = await stored_bytes(url)
                    run_id = f"run-{uuid.uuid4().hex}"
                    with recording(run_id, "bench", recordings if recorded else None):
                        times = await turns(client, history, count)
                    label = "recorded" if recorded else "not recorded"
                    rounds.record(f"{label} ms/turn", statistics.median(times), "ms")
                    if recorded:
                        await recordings.store.read(run_id)  # every write of the run ended
                        rounds.record("stored per turn", (await stored_bytes(url) - before) / count / 1024, "KiB")
                rounds.ratio("recorded / not recorded", "recorded ms/turn", "not recorded ms/turn")
            await database.close()
        await client.close()
        rounds.report()
    finally:
        server.stdin.close()
        await server.wait()
    print("\nStorage per recorded run (tests/replays):")
    for path in sorted(FIXTURES.glob("*.qrun")):
        run = read(str(path))
        print(
            f"  {path.stem}: {len(run.exchanges)} exchanges, {run.size_bytes() / 1024:.1f} KiB of distinct bodies, "
            f"{path.stat().st_size / 1024:.1f} KiB as .qrun"
        )


def main() -> None:
    args = arguments(__doc__, rounds=5, turns=100, history=20, delay=0.0)
    asyncio.run(main_async(args.rounds, args.turns, args.history, args.delay))


if __name__ == "__main__":
    main()
