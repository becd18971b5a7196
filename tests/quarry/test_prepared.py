"""Prepared statements write what Connection.execute would, and fail as it would, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quarry.db import INLINE_CHECKPOINT_COMMITS, Database, Prepared, UTCDateTime, create_engine, json_type

metadata = sa.MetaData()
notes = sa.Table(
    "prepared_notes",
    metadata,
    sa.Column("note_id", sa.String(32), primary_key=True),
    sa.Column("body", json_type(), nullable=False),
    sa.Column("written", UTCDateTime, nullable=False),
    sa.Column("counter", sa.BigInteger, nullable=False),
)
INSERT = Prepared(notes.insert(), columns=["note_id", "body", "written", "counter"])
BUMP = Prepared(
    notes.update()
    .where(notes.c.note_id == sa.bindparam("key"))
    .values(counter=notes.c.counter + sa.bindparam("by", type_=sa.BigInteger), body={"bumped": True})
    .returning(notes.c.counter)
)


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(database_url)
    metadata.create_all(engine)
    yield engine
    engine.dispose()


def test_rows_read_back_through_core_as_written(engine: sa.Engine) -> None:
    paris = timezone(timedelta(hours=1))
    written = datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=paris)
    rows = [
        {"note_id": "a", "body": {"sources": ["x"], "n": 1}, "written": written, "counter": 1},
        {"note_id": "b", "body": [], "written": written, "counter": 5},
    ]
    with engine.begin() as connection:
        INSERT.execute(connection, rows)  # executemany
        assert BUMP.execute(connection, {"key": "a", "by": 2}).fetchone()[0] == 3
    with engine.connect() as connection:
        read = connection.execute(sa.select(notes).order_by(notes.c.note_id)).all()
    assert [(r.note_id, r.body, r.written, r.counter) for r in read] == [
        ("a", {"bumped": True}, written.astimezone(UTC), 3),
        ("b", [], written.astimezone(UTC), 5),
    ]


def test_a_constraint_violation_is_sqlalchemys_integrity_error(engine: sa.Engine) -> None:
    row = {"note_id": "a", "body": {}, "written": datetime.now(UTC), "counter": 0}
    with engine.begin() as connection:
        INSERT.execute(connection, row)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
        INSERT.execute(connection, row)


def test_a_missing_row_returns_nothing(engine: sa.Engine) -> None:
    with engine.begin() as connection:
        assert BUMP.execute(connection, {"key": "absent", "by": 1}).fetchone() is None


async def test_a_write_after_a_failed_one_commits_and_the_failed_one_left_nothing(database_url: str) -> None:
    database = Database(database_url)
    metadata.create_all(database.engine)
    row = {"note_id": "a", "body": {}, "written": datetime.now(UTC), "counter": 0}

    def insert_twice(connection: sa.Connection) -> None:
        INSERT.execute(connection, {**row, "note_id": "first of a failed transaction"})
        INSERT.execute(connection, row)

    try:
        await database.write(lambda connection: INSERT.execute(connection, row))
        with pytest.raises(sa.exc.IntegrityError):
            await database.write(insert_twice)
        await database.write(lambda connection: INSERT.execute(connection, {**row, "note_id": "b"}))
        ids = await database.read(lambda c: list(c.execute(sa.select(notes.c.note_id).order_by("note_id")).scalars()))
        assert ids == ["a", "b"]
    finally:
        await database.close()


def test_statements_reach_whoever_watches_them(engine: sa.Engine) -> None:
    """Tracing's SQLAlchemy instrumentation listens for cursor executions: prepared ones must reach it."""
    seen: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def watch(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    row = {"note_id": "a", "body": {}, "written": datetime.now(UTC), "counter": 0}
    with engine.begin() as connection:
        INSERT.execute(connection, row)
        assert BUMP.execute(connection, {"key": "a", "by": 1}).fetchone()[0] == 1
    assert [statement.split()[0] for statement in seen] == ["INSERT", "UPDATE"]


async def test_inline_writes_commit_on_the_event_loop_and_a_thread_checkpoints_them(tmp_path: Path) -> None:
    path = tmp_path / "inline.db"
    database = Database(f"sqlite:///{path}", inline_writes=True)
    metadata.create_all(database.engine)
    body = {"text": "x" * 1000}
    try:
        assert await database.write(lambda connection: threading.get_ident()) == threading.get_ident()
        # The loop's own connection never checkpoints: an fsync there would stall every caller.
        assert await database.write(lambda c: c.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()) == 0
        for n in range(INLINE_CHECKPOINT_COMMITS):
            row = {"note_id": str(n), "body": body, "written": datetime.now(UTC), "counter": n}
            await database.write(lambda connection, row=row: INSERT.execute(connection, row))  # type: ignore[misc]
        # Rows reach the database file only through a checkpoint; until then they are in the WAL.
        for _ in range(3000):
            if path.stat().st_size >= INLINE_CHECKPOINT_COMMITS * 1000:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the WAL was never checkpointed")
        assert await database.read(lambda c: c.execute(sa.select(sa.func.count()).select_from(notes)).scalar()) == (
            INLINE_CHECKPOINT_COMMITS
        )
    finally:
        await database.close()
