"""Database engines shared by every service.

Each service owns its database (a URL per service) and its Alembic migrations,
applied on start (`quarry.migrations`). SQLite runs in WAL mode; PostgreSQL through
psycopg 3. Users write plain URLs (sqlite:///path, postgresql://...); the driver is
chosen here.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Dialect, make_url

from quarry.group_commit import GroupCommit, execute_on_driver
from quarry.loop_statements import LoopStatements
from quarry.outages import DRIVER_UNAVAILABLE, Outage

__all__ = [
    "Database",
    "Prepared",
    "UTCDateTime",
    "UnsupportedDatabase",
    "create_engine",
    "database_url",
    "json_type",
    "prepare_sqlite",
    "reserve_sequence_numbers",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Execution option that makes a SQLite transaction take the write lock up front,
# so two writers never deadlock upgrading a read lock.
SQLITE_WRITE = {"sqlite_begin": "BEGIN IMMEDIATE"}


# How many inline write transactions pass between two WAL checkpoints (SQLite's own default is
# 1000 pages; an append writes a few).
INLINE_CHECKPOINT_COMMITS = 256

POSTGRES_SESSION_LIMITS = (
    "SET statement_timeout = '30s'; SET lock_timeout = '10s'; SET idle_in_transaction_session_timeout = '60s'"
)


class UnsupportedDatabase(ValueError):
    pass


def database_url(url: str) -> URL:
    """Normalise a user's URL to the driver Quarry uses for that backend."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return parsed.set(drivername="sqlite")
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    raise UnsupportedDatabase(f"unsupported database {backend!r}; use sqlite:/// or postgresql://")


def prepare_sqlite(engine: sa.Engine, url: URL) -> None:
    """SQLite as every service runs it: WAL, NORMAL sync, a busy timeout, foreign keys, and BEGIN ours."""
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
        # On the driver's connection: through SQLAlchemy, BEGIN cost as much as a short statement.
        begin = connection.get_execution_options().get("sqlite_begin", "BEGIN")
        connection.connection.dbapi_connection.execute(begin)  # type: ignore[union-attr]


def create_engine(url: str, *, pool_size: int = 5) -> sa.Engine:
    """A SQLAlchemy engine for a service's database URL (SQLite in WAL mode, or psycopg 3)."""
    target = database_url(url)
    if target.get_backend_name() == "sqlite":
        engine = sa.create_engine(target, pool_size=pool_size, max_overflow=0)
        prepare_sqlite(engine, target)
        return engine
    # No pre-ping: it costs a round trip per checkout. A connection that died with
    # its server fails its statement once (reported as UNAVAILABLE, safe to retry)
    # and SQLAlchemy then replaces the pool's connections.
    engine = sa.create_engine(target, pool_size=pool_size, max_overflow=0)

    @sa.event.listens_for(engine, "connect")
    def _bound_waits(dbapi_connection: Any, _record: Any) -> None:
        # A stuck peer must not hold a thread's counter row, or our threads, forever.
        with dbapi_connection.cursor() as cursor:
            cursor.execute(POSTGRES_SESSION_LIMITS)
        dbapi_connection.commit()

    return engine


class Prepared:
    """A Core statement compiled once per dialect and executed on the driver's cursor.

    For the short statements on the hot paths (an append, a turn's messages), SQLAlchemy's work per
    execution (cache key, execution context, result objects) costs several times what SQLite spends on
    the statement itself (measured: 0.3 ms against 0.04 ms a transaction). This keeps the statement in
    Core and each column type's conversion of its parameters, and skips the rest. Errors are raised as
    SQLAlchemy's, as Connection.execute raises them. Parameters are plain (no expanding IN lists);
    `columns` names the columns an INSERT without values() sets.
    """

    def __init__(self, statement: sa.Executable, columns: Sequence[str] | None = None) -> None:
        self._statement = statement
        self._columns = list(columns) if columns is not None else None
        self._compiled: dict[str, _Compiled] = {}

    def _for(self, dialect: Dialect) -> _Compiled:
        compiled = self._compiled.get(dialect.name)
        if compiled is None:
            result = self._statement.compile(dialect=dialect, column_keys=self._columns)  # type: ignore[attr-defined]
            order = list(result.positiontup) if result.positional else list(result.binds)
            # Parameters the statement fixes itself (a literal, a function's argument) keep their values.
            fixed = {name: bind.value for name, bind in result.binds.items() if not bind.required}
            compiled = _Compiled(str(result), order, bool(result.positional), fixed, dict(result._bind_processors))
            self._compiled[dialect.name] = compiled
        return compiled

    def execute(self, connection: Connection, params: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Any:
        """Run in `connection`'s transaction (one parameter set, or a list for executemany); returns what
        to fetch rows from (fetchone)."""
        compiled = self._for(connection.dialect)
        if isinstance(params, Mapping):
            return execute_on_driver(connection, compiled.sql, compiled.bind(params))
        return execute_on_driver(connection, compiled.sql, [compiled.bind(row) for row in params], many=True)

    def for_driver(self, dialect: Dialect, params: Mapping[str, Any]) -> tuple[str, tuple[Any, ...] | dict[str, Any]]:
        """The SQL and the parameters to hand `dialect`'s driver for one parameter set."""
        compiled = self._for(dialect)
        return compiled.sql, compiled.bind(params)


@dataclass(frozen=True)
class _Compiled:
    sql: str
    names: list[str]  # in the driver's order when it takes parameters by position
    positional: bool
    fixed: dict[str, Any]
    processors: dict[str, Callable[[Any], Any]]

    def bind(self, row: Mapping[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        fixed, processors = self.fixed, self.processors
        values = {}
        for name in self.names:
            value = row[name] if name in row else fixed[name]
            processor = processors.get(name)
            values[name] = value if processor is None else processor(value)
        return tuple(values[name] for name in self.names) if self.positional else values


class Database:
    """A service's database, used from asyncio.

    Each unit of work is a plain function over a SQLAlchemy connection, run off the event loop
    as one transaction: reads in a thread pool, writes by group commit (quarry.group_commit), so
    the writes that wait at one moment share one commit and one hop back to the loop. (Measured
    on the 2-core CI machine: SQLAlchemy's asyncio adapters cost one hop per statement, about 4x
    slower per append.) SQLite gets a single writer, since it admits one writer at a time anyway;
    PostgreSQL gets several.
    """

    def __init__(self, url: str, *, readers: int = 4, writers: int | None = None, inline_writes: bool = False) -> None:
        """`inline_writes`: on SQLite, write transactions run on the event loop itself (see write)."""
        self.url = database_url(url)
        sqlite = self.url.get_backend_name() == "sqlite"
        self._inline = inline_writes and sqlite
        self._inline_commits = 0
        self._inline_connection: Connection | None = None
        self._checkpoint: asyncio.Future[None] | None = None
        writers = writers or (1 if sqlite else 4)
        # A writer (a thread, or the loop with inline writes) holds a connection of its own, and
        # may check out another (autocommit, a checkpoint).
        self.engine = create_engine(url, pool_size=readers + 2 * writers)
        self.is_postgres = not sqlite
        # Whether `write` runs its transaction on the event loop, never yielding until it has committed.
        self.writes_inline = self._inline
        self._outage = Outage(self.url)
        self._writes = GroupCommit(
            self.engine, writers=writers, begin_options=SQLITE_WRITE if sqlite else {}, translate=self._outage.failed
        )
        self._reader = ThreadPoolExecutor(readers, thread_name_prefix="db-read")
        self._statements = (
            None
            if sqlite
            else LoopStatements(self.url, self.engine.dialect, size=writers, session_setup=POSTGRES_SESSION_LIMITS)
        )

    def health_problem(self) -> str | None:
        """Why a service over this database should report NOT_SERVING (its disk is full), or None."""
        return self._outage.problem()

    async def write(self, work: Callable[[Connection], _T], *, context: contextvars.Context | None = None) -> _T:
        """Run `work` in a write transaction (SQLite takes its write lock up front), shared with the
        writes queued beside it, each in a savepoint of its own; returns once it has committed.

        `context` is the one to run it in (whose span its statements belong to), when not the caller's.
        With inline writes the transaction runs here, on the event loop: a short SQLite transaction
        costs less than the hop to a thread and back (about 0.1 ms on a busy machine). It never waits
        for an fsync (WAL, synchronous=NORMAL; checkpoints run in a thread, see _inline_write), but
        blocks the loop while another connection holds the write lock, so only a service whose
        database no other process writes uses it.
        """
        if self._inline:
            return self._inline_write(work, context)
        result = await self._writes.submit(work, context or contextvars.copy_context())
        self._answered()
        return result

    def _inline_write(self, work: Callable[[Connection], _T], context: contextvars.Context | None) -> _T:
        try:
            result = (context or contextvars.copy_context()).run(self._sqlite_write, work)
        except DRIVER_UNAVAILABLE as error:
            raise self._outage.failed(error) from error
        self._answered()
        self._inline_commits += 1
        # The loop's connection never checkpoints (its fsync would stall every RPC): a thread does,
        # one at a time, every so many commits. PASSIVE: it never makes a writer wait.
        if self._inline_commits % INLINE_CHECKPOINT_COMMITS == 0 and (
            self._checkpoint is None or self._checkpoint.done()
        ):
            self._checkpoint = asyncio.get_running_loop().run_in_executor(self._reader, self._checkpoint_wal)
        return result

    def _checkpoint_wal(self) -> None:
        with self.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    async def write_autocommit(
        self, work: Callable[[Connection], _T], *, context: contextvars.Context | None = None
    ) -> _T:
        """Run `work` with each statement its own transaction: for single-statement writes."""
        return await self._writes.submit(work, context or contextvars.copy_context(), autocommit=True)

    async def write_statement(
        self, statement: Prepared, params: Mapping[str, Any], *, context: contextvars.Context | None = None
    ) -> tuple[Any, ...] | None:
        """Run one statement as its own transaction; its first row (None when it returns none), once it has
        committed. On PostgreSQL it runs on a connection the event loop owns (quarry.loop_statements: no thread
        hop), unless someone watches statements (SQL tracing), whose hooks are SQLAlchemy's."""
        if self._statements is None or self.engine.dispatch.before_cursor_execute:
            return await self.write_autocommit(
                lambda connection: statement.execute(connection, params).fetchone(), context=context
            )
        try:
            row = await self._statements.first_row(*statement.for_driver(self.engine.dialect, params))
        except DRIVER_UNAVAILABLE as error:
            raise self._outage.failed(error) from error
        self._answered()
        return row

    async def read(self, work: Callable[[Connection], _T]) -> _T:
        """Run `work` in one read transaction."""
        return await self._read(self._transaction, work)

    async def read_statement(self, work: Callable[[Connection], _T]) -> _T:
        """Run a single-statement read without BEGIN/ROLLBACK round trips; one statement sees one snapshot."""
        return await self._read(self._autocommit, work)

    async def _read(self, function: Callable[[Callable[[Connection], _T]], _T], work: Callable[[Connection], _T]) -> _T:
        try:
            # The caller's context goes along, so a traced statement belongs to the caller's span.
            context = contextvars.copy_context()
            result = await asyncio.get_running_loop().run_in_executor(self._reader, context.run, function, work)
        except DRIVER_UNAVAILABLE as error:
            raise self._outage.failed(error) from error
        self._answered()
        return result

    def _answered(self) -> None:
        """A call succeeded. The first after a PostgreSQL outage drops the connections opened before it (the
        pool's idle ones, those the group-commit writers hold, the event loop's own): they died with the
        server's side of them, and each would otherwise fail once more, one caller at a time (a run would then
        wait out a second outage of a few milliseconds, and ask its model again)."""
        if self._outage.succeeded() and self.engine.dialect.name == "postgresql":
            self.engine.dispose()
            self._writes.renew_connections()
            if self._statements is not None:
                self._statements.drop_idle()

    def _transaction(self, work: Callable[[Connection], _T]) -> _T:
        with self.engine.connect() as connection, connection.begin():
            return work(connection)

    def _sqlite_write(self, work: Callable[[Connection], _T]) -> _T:
        """An inline write transaction on the loop's own connection: checking one out of the pool and
        back cost about as much as a short transaction itself."""
        connection = self._inline_connection
        if connection is None or connection.closed or connection.invalidated:
            connection = self.engine.connect().execution_options(**SQLITE_WRITE)
            # On the driver: through SQLAlchemy it would begin a transaction.
            connection.connection.dbapi_connection.execute("PRAGMA wal_autocheckpoint=0")  # type: ignore[union-attr]
            self._inline_connection = connection
        try:
            with connection.begin():
                return work(connection)
        except BaseException:
            # The connection may be unusable after a failure: the next write takes a fresh one.
            self._release()
            raise

    def _release(self) -> None:
        connection, self._inline_connection = self._inline_connection, None
        if connection is not None:
            connection.close()

    def _autocommit(self, work: Callable[[Connection], _T]) -> _T:
        with self.engine.connect() as connection:
            return work(connection.execution_options(isolation_level="AUTOCOMMIT"))

    async def close(self) -> None:
        """Commit the writes queued, then close; a write after this is refused."""
        if self._inline:
            self._release()
            if self._checkpoint is not None:
                await asyncio.gather(self._checkpoint, return_exceptions=True)
        await self._writes.close()
        if self._statements is not None:
            await self._statements.close()
        await asyncio.get_running_loop().run_in_executor(None, self._reader.shutdown)
        self.engine.dispose()


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


def reserve_sequence_numbers(
    connection: Connection, counters: sa.Table, key: sa.ColumnElement[bool], count: int
) -> int | None:
    """Advance a `last_sequence_no` counter row by `count`; returns the first reserved number.

    The update locks the row until the transaction ends, so writers of one
    sequence take turns and the numbers they insert follow commit order with no
    gaps. None when no row matches `key`.
    """
    last = connection.execute(
        counters.update()
        .where(key)
        .values(last_sequence_no=counters.c.last_sequence_no + count)
        .returning(counters.c.last_sequence_no)
    ).scalar()
    return None if last is None else int(last) - count + 1
