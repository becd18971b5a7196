"""Database engines and schema migrations shared by every service.

Each service owns its database (a URL per service) and its Alembic migrations,
applied on start. SQLite runs through aiosqlite in WAL mode; PostgreSQL through
psycopg 3. Users write plain URLs (sqlite:///path, postgresql://...); the driver
is chosen here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from sqlalchemy.engine import URL, Connection, Dialect, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

log = logging.getLogger(__name__)

T = TypeVar("T")

# Execution option that makes a SQLite transaction take the write lock up front,
# so two writers never deadlock upgrading a read lock.
SQLITE_WRITE = {"sqlite_begin": "BEGIN IMMEDIATE"}


class UnsupportedDatabase(ValueError):
    pass


def database_url(url: str, *, asynchronous: bool) -> URL:
    """Normalise a user's URL to the driver Quarry uses for that backend."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite" if asynchronous else "sqlite")
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    raise UnsupportedDatabase(f"unsupported database {backend!r}; use sqlite:/// or postgresql://")


def is_postgres(engine: AsyncEngine | sa.Engine) -> bool:
    return engine.dialect.name == "postgresql"


def _prepare_sqlite(engine: sa.Engine, url: URL) -> None:
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN is ours to issue.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash; only an OS crash can lose
        # the last transactions.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql(connection.get_execution_options().get("sqlite_begin", "BEGIN"))


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """An async engine for a service's database URL."""
    target = database_url(url, asynchronous=True)
    if target.get_backend_name() == "sqlite":
        engine = create_async_engine(target, pool_size=pool_size, max_overflow=0)
        _prepare_sqlite(engine.sync_engine, target)
        return engine
    return create_async_engine(target, pool_size=pool_size, max_overflow=0, pool_pre_ping=True)


def _sync_engine(url: str) -> sa.Engine:
    target = database_url(url, asynchronous=False)
    engine = sa.create_engine(target, poolclass=sa.pool.NullPool)
    if target.get_backend_name() == "sqlite":
        _prepare_sqlite(engine, target)
    return engine


def upgrade_schema(url: str, migrations: Path, version_table: str) -> None:
    """Apply a service's Alembic migrations up to head (blocking; call from a thread).

    On PostgreSQL an advisory lock serialises replicas that start together.
    """
    engine = _sync_engine(url)
    config = Config()
    config.set_main_option("script_location", str(migrations))
    config.attributes["version_table"] = version_table
    lock_key = int.from_bytes(hashlib.sha256(version_table.encode()).digest()[:8], "big", signed=True)
    try:
        with engine.connect() as connection:
            if is_postgres(engine):
                connection.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": lock_key})
                connection.commit()
            try:
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
                connection.commit()
            finally:
                if is_postgres(engine):
                    connection.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": lock_key})
                    connection.commit()
    finally:
        engine.dispose()


async def upgrade_schema_async(url: str, migrations: Path, version_table: str) -> None:
    await asyncio.to_thread(upgrade_schema, url, migrations, version_table)


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


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every backend (SQLite stores them naive)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def json_type() -> sa.types.TypeEngine[Any]:
    """JSON on SQLite, JSONB on PostgreSQL."""
    from sqlalchemy.dialects.postgresql import JSONB

    return sa.JSON().with_variant(JSONB(), "postgresql")


async def run_in_transaction(engine: AsyncEngine, work: Callable[[AsyncConnection], Awaitable[T]], *, write: bool) -> T:
    """Run `work` in one transaction; writes take SQLite's write lock up front."""
    async with engine.connect() as connection:
        if write and engine.dialect.name == "sqlite":
            connection = await connection.execution_options(**SQLITE_WRITE)
        async with connection.begin():
            return await work(connection)
