"""Schema migrations shared by every service: each service's Alembic migrations, applied on start.

On PostgreSQL an advisory lock serialises replicas that start together, on SQLite a file lock beside
the database; `quarry doctor` reads the revisions without writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from quarry.db import Database, database_url, prepare_sqlite

# Alembic (10 MiB of a process's memory) is imported by the functions that migrate or read revisions:
# every service imports this module through quarry.diagnostics, and one without tables never migrates.
if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext

__all__ = [
    "open_migrated_database",
    "run_migrations",
    "schema_revisions",
    "upgrade_schema",
    "upgrade_schema_async",
]


def upgrade_schema(url: str, migrations: Path, version_table: str, revision: str = "head") -> None:
    """Apply a service's Alembic migrations up to head, or to `revision` (blocking; call from a thread).

    On PostgreSQL an advisory lock serialises replicas that start together; on SQLite a lock on a file
    beside the database does (the workers of `quarry up` share one file).
    """
    from alembic import command

    sqlite_path = _sqlite_file(url)
    if sqlite_path is not None:
        with _file_lock(sqlite_path.with_name(sqlite_path.name + ".migrating")):
            _upgrade(url, migrations, version_table, revision, command)
        return
    _upgrade(url, migrations, version_table, revision, command)


def _sqlite_file(url: str) -> Path | None:
    parsed = sa.engine.make_url(database_url(url))
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _upgrade(url: str, migrations: Path, version_table: str, revision: str, command: Any) -> None:
    engine = sa.create_engine(database_url(url), poolclass=sa.pool.NullPool)
    if engine.dialect.name == "sqlite":
        prepare_sqlite(engine, engine.url)
    postgres = engine.dialect.name == "postgresql"
    config = _alembic_config(migrations)
    config.attributes["version_table"] = version_table
    lock_key = int.from_bytes(hashlib.sha256(version_table.encode()).digest()[:8], "big", signed=True)
    try:
        with engine.connect() as connection:
            if postgres:
                connection.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": lock_key})
                connection.commit()
            try:
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
                connection.commit()
            finally:
                if postgres:
                    connection.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": lock_key})
                    connection.commit()
    finally:
        engine.dispose()


def schema_revisions(url: str, migrations: Path, version_table: str) -> tuple[str | None, str | None]:
    """(the revision the database is at, the newest the code has); None where there is none yet.

    Reads only: a SQLite file that does not exist is not created.
    """
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config(migrations)).get_current_head()
    parsed = database_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and not Path(parsed.database).exists():
        return None, head
    engine = sa.create_engine(parsed, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(
                connection, opts={"version_table": version_table}
            ).get_current_revision()
    finally:
        engine.dispose()
    return current, head


def _alembic_config(migrations: Path) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations))
    return config


async def upgrade_schema_async(url: str, migrations: Path, version_table: str) -> None:
    await asyncio.to_thread(upgrade_schema, url, migrations, version_table)


async def open_migrated_database(
    url: str, migrations: Path, version_table: str, *, inline_writes: bool = False
) -> Database:
    """The database a service starts with: its schema first brought up to head, then opened. Every service
    that owns tables starts this way, so the order (never open a database the code has not migrated) is
    kept in one place."""
    await upgrade_schema_async(url, migrations, version_table)
    return Database(url, inline_writes=inline_writes)


def run_migrations(context: EnvironmentContext, target_metadata: sa.MetaData) -> None:
    """The body of every service's migrations/env.py."""
    if context.is_offline_mode():
        raise RuntimeError("Quarry migrations run online, on start; offline SQL generation is not supported")
    connection: Connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=context.config.attributes["version_table"],
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
