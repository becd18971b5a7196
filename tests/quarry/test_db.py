"""Group commit: writes queued together commit together, fail alone, and are durable when write returns."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from quarry.db import Database, create_engine
from quarry.errors import Unavailable
from quarry.group_commit import GroupCommit

metadata = sa.MetaData()
parents = sa.Table("group_parents", metadata, sa.Column("parent_id", sa.Integer, primary_key=True))
children = sa.Table(
    "group_children",
    metadata,
    sa.Column("child_id", sa.Integer, primary_key=True),
    # Checked at COMMIT: a missing parent fails the commit, not the statement.
    sa.Column(
        "parent_id",
        sa.Integer,
        sa.ForeignKey("group_parents.parent_id", deferrable=True, initially="DEFERRED"),
        nullable=True,
    ),
)


def insert(child_id: int, parent_id: int | None = None) -> Callable[[sa.Connection], int]:
    def work(connection: sa.Connection) -> int:
        connection.execute(children.insert().values(child_id=child_id, parent_id=parent_id))
        return child_id

    return work


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    # One writer: with PostgreSQL's several, an idle writer would take the units queued behind a held one.
    database = Database(database_url, writers=1)
    metadata.create_all(database.engine)
    yield database
    await database.close()


@pytest.fixture
def other(database_url: str) -> Iterator[sa.Engine]:
    """Another engine on the same database: it sees only what has committed."""
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


def stored(engine: sa.Engine) -> list[int]:
    with engine.connect() as connection:
        return list(connection.execute(sa.select(children.c.child_id).order_by(children.c.child_id)).scalars())


def count_commits(database: Database) -> list[None]:
    commits: list[None] = []
    sa.event.listen(database.engine, "commit", lambda _connection: commits.append(None))
    return commits


class Held:
    """A first write that holds the writer until released, so the writes behind it queue up."""

    def __init__(self, database: Database) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.task = asyncio.create_task(database.write(self._hold))

    def _hold(self, connection: sa.Connection) -> None:
        self.started.set()
        assert self.release.wait(30), "never released"

    async def queue_behind(self, writes: list[Any]) -> list[asyncio.Task[Any]]:
        await asyncio.to_thread(self.started.wait, 30)
        tasks = [asyncio.ensure_future(write) for write in writes]
        await asyncio.sleep(0)  # each task runs up to its wait: queued
        self.release.set()
        await self.task
        return tasks


async def test_writes_queued_together_commit_in_one_transaction(database: Database, other: sa.Engine) -> None:
    commits = count_commits(database)
    held = Held(database)
    tasks = await held.queue_behind([database.write(insert(n)) for n in range(20)])
    assert await asyncio.gather(*tasks) == list(range(20))
    assert len(commits) == 2  # the held write's, and one for the twenty queued behind it
    assert stored(other) == list(range(20))


async def test_a_failing_unit_fails_only_its_caller_and_takes_back_only_its_statements(
    database: Database, other: sa.Engine
) -> None:
    def insert_then_fail(connection: sa.Connection) -> None:
        insert(100)(connection)
        raise LookupError("this unit's own failure")

    def duplicate(connection: sa.Connection) -> None:
        insert(101)(connection)
        insert(1)(connection)  # the key of the first unit of the batch

    def unreachable(connection: sa.Connection) -> None:
        raise sa.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"))

    held = Held(database)
    writes = [insert_then_fail, insert(1), duplicate, insert(2), unreachable, insert(3)]
    tasks = await held.queue_behind([database.write(work) for work in writes])
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(outcomes[0], LookupError)
    assert outcomes[1::2] == [1, 2, 3]
    assert isinstance(outcomes[2], sa.exc.IntegrityError)
    # The database being out of reach is worth a retry, as before group commit.
    assert isinstance(outcomes[4], Unavailable)
    assert stored(other) == [1, 2, 3]


async def test_a_failed_commit_fails_every_unit_of_its_batch(database: Database, other: sa.Engine) -> None:
    held = Held(database)
    writes = [insert(1), insert(2, parent_id=404), insert(3)]  # no parent 404: the COMMIT fails
    tasks = await held.queue_behind([database.write(work) for work in writes])
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(outcome, sa.exc.IntegrityError) for outcome in outcomes), outcomes
    assert stored(other) == []
    # The writer goes on with a fresh transaction.
    assert await database.write(insert(4)) == 4
    assert stored(other) == [4]


async def test_a_write_is_visible_to_other_connections_when_it_returns(database: Database, other: sa.Engine) -> None:
    unseen: list[int] = []

    async def write_and_look(child_id: int) -> None:
        await database.write(insert(child_id))
        if child_id not in stored(other):
            unseen.append(child_id)

    await asyncio.gather(*(write_and_look(n) for n in range(50)))
    assert unseen == []


async def test_close_commits_what_is_queued_then_refuses_writes(database_url: str, other: sa.Engine) -> None:
    database = Database(database_url)
    metadata.create_all(database.engine)
    tasks = [asyncio.ensure_future(database.write(insert(n))) for n in range(100)]
    await asyncio.sleep(0)
    await database.close()
    assert all(task.done() for task in tasks)
    assert [task.result() for task in tasks] == list(range(100))
    assert stored(other) == list(range(100))
    with pytest.raises(Unavailable, match="closed"):
        await database.write(insert(100))


async def test_a_write_whose_caller_gave_up_before_it_ran_is_not_run(database: Database, other: sa.Engine) -> None:
    held = Held(database)
    await asyncio.to_thread(held.started.wait, 30)
    abandoned = asyncio.ensure_future(database.write(insert(1)))
    await asyncio.sleep(0)  # queued
    abandoned.cancel()
    tasks = await held.queue_behind([database.write(insert(2))])
    assert await asyncio.gather(*tasks) == [2]
    assert abandoned.cancelled()
    assert stored(other) == [2]


async def test_a_unit_runs_in_the_context_it_is_given(database: Database) -> None:
    span: contextvars.ContextVar[str] = contextvars.ContextVar("span", default="none")
    context = contextvars.copy_context()
    context.run(span.set, "the caller's span")
    assert await database.write(lambda _connection: span.get(), context=context) == "the caller's span"
    span.set("this task's span")
    assert await database.write(lambda _connection: span.get()) == "this task's span"


async def test_writers_wait_for_room_beyond_the_bound(database: Database) -> None:
    """With room for two units in flight, no batch holds more than two, and every write still commits."""
    commits = count_commits(database)
    writes = GroupCommit(database.engine, writers=1, begin_options={}, translate=lambda error: error, max_pending=2)
    batch_of: list[int] = []
    try:
        # Each unit notes which transaction it ran in (the commits before it).
        results = await asyncio.gather(
            *(writes.submit(lambda _c: batch_of.append(len(commits)), contextvars.copy_context()) for _ in range(12))
        )
    finally:
        await writes.close()
    assert len(results) == 12
    assert max(Counter(batch_of).values()) <= 2
