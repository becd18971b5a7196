"""The supervisor's migrations build exactly the schema its code declares, on SQLite and PostgreSQL."""

from __future__ import annotations

from supervisor_svc.schema import metadata
from supervisor_svc.service import MIGRATIONS, VERSION_TABLE
from tests.conftest import assert_migrations_build_the_schema


def test_migrations_match_the_schema(database_url: str) -> None:
    assert_migrations_build_the_schema(database_url, MIGRATIONS, VERSION_TABLE, metadata)
