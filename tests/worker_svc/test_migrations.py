from __future__ import annotations

from tests.conftest import assert_migrations_build_the_schema
from worker_svc.schema import metadata
from worker_svc.service import MIGRATIONS, VERSION_TABLE


def test_migrations_match_the_schema_and_are_repeatable(database_url: str) -> None:
    assert_migrations_build_the_schema(database_url, MIGRATIONS, VERSION_TABLE, metadata)
