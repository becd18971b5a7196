"""Database.write_statement: one statement committed when it returns, on the event loop's own connections on
PostgreSQL (quarry.loop_statements), failing as SQLAlchemy's errors, and recovering from a dropped connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from quarry.db import Database, create_engine
from quarry.errors import Unavailable
from tests.conftest import POSTGRES_URL
from tests.quarry.test_prepared import BUMP, INSERT, metadata, notes

WRITTEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    metadata.create_all(database.engine)
    yield database
    await database.close()


def note(note_id: str) -> dict[str, Any]:
    return {"note_id": note_id, "body": {"k": [1, "é"]}, "written": WRITTEN, "counter": 1}


def stored(database_url: str) -> list[tuple[Any, ...]]:
    """What another connection sees: only what has committed."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.select(notes).order_by(notes.c.note_id))]
    finally:
        engine.dispose()


async def test_a_statement_has_committed_when_it_returns_its_first_row(database: Database, database_url: str) -> None:
    assert await database.write_statement(INSERT, note("a")) is None  # no rows to return
    assert await database.write_statement(BUMP, {"key": "a", "by": 41}) == (42,)
    assert await database.write_statement(BUMP, {"key": "missing", "by": 1}) is None
    assert stored(database_url) == [("a", {"bumped": True}, WRITTEN, 42)]


async def test_a_constraint_violation_is_sqlalchemys_integrity_error_and_the_next_statement_commits(
    database: Database, database_url: str
) -> None:
    await database.write_statement(INSERT, note("a"))
    with pytest.raises(sa.exc.IntegrityError):
        await database.write_statement(INSERT, note("a"))
    await database.write_statement(INSERT, note("b"))
    assert [row[0] for row in stored(database_url)] == ["a", "b"]


async def test_statements_reach_whoever_watches_them(database: Database) -> None:
    seen: list[str] = []
    sa.event.listen(database.engine, "before_cursor_execute", lambda *args: seen.append(args[2]))
    assert await database.write_statement(BUMP, {"key": "missing", "by": 1}) is None
    assert [sql for sql in seen if sql.startswith("UPDATE prepared_notes")]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_dropped_connection_fails_one_statement_as_unavailable_then_is_replaced(
    database: Database, database_url: str
) -> None:
    await database.write_statement(INSERT, note("a"))
    conninfo = make_url(POSTGRES_URL).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        killed = connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s AND query LIKE %s",
            (make_url(database_url).query["application_name"], "INSERT INTO prepared_notes%"),
        ).fetchall()
    assert len(killed) == 1
    with pytest.raises(Unavailable):
        await database.write_statement(INSERT, note("b"))
    await database.write_statement(INSERT, note("c"))
    assert [row[0] for row in stored(database_url)] == ["a", "c"]


async def test_a_statement_after_close_is_refused_as_unavailable(database_url: str) -> None:
    database = Database(database_url)
    metadata.create_all(database.engine)
    await database.close()
    with pytest.raises(Unavailable):
        await database.write_statement(INSERT, note("a"))
