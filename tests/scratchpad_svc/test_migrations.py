from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

from quarry.db import database_url as database_url_for
from quarry.migrations import upgrade_schema
from scratchpad_svc.schema import entries, metadata, threads
from scratchpad_svc.service import MIGRATIONS, VERSION_TABLE
from tests.conftest import assert_migrations_build_the_schema


def test_migrations_match_the_schema_and_are_repeatable(database_url: str) -> None:
    assert_migrations_build_the_schema(database_url, MIGRATIONS, VERSION_TABLE, metadata)


def test_entries_of_the_retired_synthesis_kind_become_notes(database_url: str) -> None:
    upgrade_schema(database_url, MIGRATIONS, VERSION_TABLE, revision="0001")
    engine = sa.create_engine(database_url_for(database_url))
    now = datetime.now(UTC)
    with engine.begin() as connection:
        connection.execute(
            threads.insert().values(thread_id="t", title="", labels={}, create_time=now, last_sequence_no=1)
        )
        connection.execute(
            entries.insert().values(
                thread_id="t",
                sequence_no=1,
                request_id="r",
                fingerprint="f" * 64,
                kind="synthesis",
                author_id="run-1",
                author_role="supervisor",
                content="the report",
                sources=[],
                create_time=now,
            )
        )
    upgrade_schema(database_url, MIGRATIONS, VERSION_TABLE)
    with engine.connect() as connection:
        assert connection.execute(sa.select(entries.c.kind, entries.c.content)).one() == ("note", "the report")
    engine.dispose()
