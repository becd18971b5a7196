from __future__ import annotations

from scratchpad_svc.schema import metadata
from scratchpad_svc.service import MIGRATIONS, VERSION_TABLE
from tests.conftest import assert_migrations_build_the_schema


def test_migrations_match_the_schema_and_are_repeatable(database_url: str) -> None:
    assert_migrations_build_the_schema(database_url, MIGRATIONS, VERSION_TABLE, metadata)
