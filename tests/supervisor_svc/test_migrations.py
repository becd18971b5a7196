"""The supervisor's migrations build exactly the schema its code declares, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

from quarry.db import database_url as database_url_for
from quarry.migrations import upgrade_schema
from supervisor_svc.schema import metadata, runs
from supervisor_svc.service import MIGRATIONS, VERSION_TABLE
from tests.conftest import assert_migrations_build_the_schema


def test_migrations_match_the_schema(database_url: str) -> None:
    assert_migrations_build_the_schema(database_url, MIGRATIONS, VERSION_TABLE, metadata)


def test_cancelled_runs_keep_their_reason_as_cancel_reason_not_as_an_error(database_url: str) -> None:
    upgrade_schema(database_url, MIGRATIONS, VERSION_TABLE, revision="0001")
    engine = sa.create_engine(database_url_for(database_url))
    now = datetime.now(UTC)
    row = {
        "request_digest": "d" * 64,
        "question": "?",
        "options": {},
        "labels": {},
        "scratchpad_thread_id": "t",
        "report": None,
        "usage": {},
        "last_sequence_no": 1,
        "owner": "gone",
        "heartbeat_time": now,
        "create_time": now,
    }
    with engine.begin() as connection:
        connection.execute(
            runs.insert(),
            [
                {**row, "run_id": "run-c", "state": "cancelled", "error_code": "cancelled", "last_error": "stop"},
                {**row, "run_id": "run-f", "state": "failed", "error_code": "internal", "last_error": "boom"},
            ],
        )
    upgrade_schema(database_url, MIGRATIONS, VERSION_TABLE)
    with engine.connect() as connection:
        query = sa.select(runs.c.run_id, runs.c.error_code, runs.c.last_error, runs.c.cancel_reason)
        found = {row.run_id: tuple(row)[1:] for row in connection.execute(query.order_by(runs.c.run_id))}
    engine.dispose()
    assert found == {"run-c": ("", "", "stop"), "run-f": ("internal", "boom", None)}
