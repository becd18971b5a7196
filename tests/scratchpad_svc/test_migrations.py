"""The scratchpad's migrations build exactly the schema its code uses, and re-running them is harmless."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from quarry.db import create_engine, upgrade_schema
from scratchpad_svc.schema import metadata
from scratchpad_svc.service import MIGRATIONS, VERSION_TABLE


def test_migrations_match_the_schema_and_are_repeatable(database_url: str) -> None:
    upgrade_schema(database_url, MIGRATIONS, VERSION_TABLE)
    upgrade_schema(database_url, MIGRATIONS, VERSION_TABLE)  # a restart re-runs it
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
            assert context.get_current_revision() == "0001"
            assert compare_metadata(context, metadata) == []
            tables = set(sa.inspect(connection).get_table_names())
    finally:
        engine.dispose()
    assert {"scratchpad_threads", "scratchpad_entries", VERSION_TABLE} <= tables
