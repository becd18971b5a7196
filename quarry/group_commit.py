"""Group commit: the write transactions that wait at one moment commit together.

A writer thread per write connection drains one queue: it takes every unit of
work queued (up to MAX_BATCH), runs each inside a SAVEPOINT of one transaction,
commits once, and then hands the whole batch's outcomes back to the event loop
in one call. Under concurrency a turn's write then costs a share of one commit
(one WAL write on SQLite, one WAL flush on PostgreSQL) and of one hop back to
the loop, instead of a transaction and two hops of its own. A unit's failure
rolls back that unit only and fails only its caller; a failed commit fails every
unit of the batch; no caller hears of its write before the commit.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from quarry.errors import ErrorReason, Unavailable

__all__ = ["MAX_BATCH", "MAX_PENDING", "GroupCommit", "execute_on_driver"]

_T = TypeVar("_T")

# Units in one transaction: bounds how long a batch holds the write lock and its row locks.
MAX_BATCH = 256
# Units queued or running before write() waits for room (backpressure on a database that falls behind).
MAX_PENDING = 4096


@dataclass(eq=False)
class _Unit:
    work: Callable[[Connection], Any]
    context: contextvars.Context
    future: asyncio.Future[Any]
    autocommit: bool
    outcome: Any = None
    error: BaseException | None = None


# Where a writer's connection records the generation it was opened in (GroupCommit.renew_connections).
_GENERATION = "quarry.group_commit.generation"


class GroupCommit:
    """Write transactions of one database, run by `writers` threads that each hold a connection.

    `begin_options` are the execution options of a writer's connection (SQLite's BEGIN IMMEDIATE);
    `translate` turns a unit's error into the one its caller gets. With several writers (PostgreSQL),
    two batches that lock the same rows in opposite orders deadlock; PostgreSQL then fails one unit
    (rolled back to its savepoint, so its batch goes on), which its caller sees as UNAVAILABLE.
    """

    def __init__(
        self,
        engine: sa.Engine,
        *,
        writers: int,
        begin_options: Mapping[str, Any],
        translate: Callable[[BaseException], BaseException],
        max_pending: int = MAX_PENDING,
    ) -> None:
        if writers < 1 or max_pending < 1:
            raise ValueError(f"writers and max_pending must be at least 1, not {writers} and {max_pending}")
        self._engine = engine
        self._writers = writers
        self._options = dict(begin_options)
        self._translate = translate
        self._max_pending = max_pending
        self._queue: deque[_Unit] = deque()
        self._lock = threading.Lock()
        # Writers waiting for work, the latest last. The latest wakes first: with little to do, one
        # connection (and its PostgreSQL backend) stays warm, as the pool's one did before.
        self._idle: list[threading.Lock] = []
        self._closing = False
        # Bumped when the connections writers hold may have died (a database outage ended): a writer whose
        # connection is from an earlier generation takes a fresh one for its next batch.
        self._generation = 0
        self._threads: list[threading.Thread] = []
        # Loop side: units submitted and not yet settled, and the callers waiting for room.
        self._pending = 0
        self._room: deque[asyncio.Future[None]] = deque()

    async def submit(
        self, work: Callable[[Connection], _T], context: contextvars.Context, *, autocommit: bool = False
    ) -> _T:
        """Run `work` in the next batch's transaction (or, `autocommit`, on a connection of its own); returns
        once it has committed."""
        loop = asyncio.get_running_loop()
        # Each settled unit wakes one waiter, so a waiter waits for at most max_pending units ahead of it.
        while self._pending >= self._max_pending and not self._closing:
            room = loop.create_future()
            self._room.append(room)
            await room
        if self._closing:
            raise Unavailable("the database is closed", reason=ErrorReason.DATABASE_UNAVAILABLE)
        unit = _Unit(work, context, loop.create_future(), autocommit)
        self._pending += 1
        with self._lock:
            if not self._threads:
                self._start()
            self._queue.append(unit)
            if self._idle:
                self._idle.pop().release()
        result: _T = await unit.future
        return result

    def _start(self) -> None:
        for number in range(self._writers):
            thread = threading.Thread(target=self._drain, name=f"db-write-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _drain(self) -> None:
        connection: Connection | None = None
        try:
            while (batch := self._next_batch()) is not None:  # until close() and an empty queue
                for unit in batch:
                    if unit.autocommit:
                        self._autocommit(unit)
                transactional = [unit for unit in batch if not unit.autocommit]
                if transactional:
                    connection = self._commit(transactional, connection)
                self._resolve(batch)
        finally:
            if connection is not None:
                connection.close()

    def _next_batch(self) -> list[_Unit] | None:
        """What is queued (up to MAX_BATCH), once there is some; None once closed and drained."""
        while True:  # each wake-up comes with work (which another writer may have taken) or close()
            with self._lock:
                if self._queue:
                    return [self._queue.popleft() for _ in range(min(MAX_BATCH, len(self._queue)))]
                if self._closing:
                    return None
                wake = threading.Lock()
                wake.acquire()
                self._idle.append(wake)
            wake.acquire()

    def _commit(self, units: list[_Unit], connection: Connection | None) -> Connection | None:
        """Run `units` in one transaction on the writer's own connection (checking one out per batch would cost
        about as much as a short transaction); returns the connection for the next batch."""
        try:
            if (
                connection is not None
                and not connection.closed
                and connection.info.get(_GENERATION) != self._generation
            ):
                connection.close()  # opened before an outage: most likely dead with the server's side of it
            if connection is None or connection.closed or connection.invalidated:
                connection = self._engine.connect().execution_options(**self._options)
                connection.info[_GENERATION] = self._generation
            with connection.begin():
                if len(units) == 1:  # the transaction is the unit's: no savepoint to pay for
                    _run(units[0], connection)
                    if units[0].error is not None:
                        raise units[0].error
                else:
                    _in_savepoints(units, connection)
            return connection
        except BaseException as error:
            # The commit (or a rollback) failed: nothing of the batch is durable.
            for unit in units:
                if unit.error is None:
                    unit.error = error
            # The connection may be unusable after a failure: the next batch takes a fresh one.
            if connection is not None:
                connection.close()
            return None

    def _autocommit(self, unit: _Unit) -> None:
        try:
            with self._engine.connect() as connection:
                _run(unit, connection.execution_options(isolation_level="AUTOCOMMIT"))
        except BaseException as error:
            unit.error = error

    def _resolve(self, batch: list[_Unit]) -> None:
        """Hand the batch back to its callers: one call per event loop, not one per unit."""
        by_loop: dict[asyncio.AbstractEventLoop, list[_Unit]] = {}
        for unit in batch:
            by_loop.setdefault(unit.future.get_loop(), []).append(unit)
        for loop, units in by_loop.items():
            try:
                loop.call_soon_threadsafe(self._settle, units)
            except RuntimeError:  # that loop has closed: nobody is left to hear of these units
                continue

    def _settle(self, units: list[_Unit]) -> None:
        for unit in units:
            self._pending -= 1
            self._make_room()
            if unit.future.done():  # its caller stopped waiting
                continue
            if unit.error is None:
                unit.future.set_result(unit.outcome)
            else:
                unit.future.set_exception(self._translate(unit.error))

    def _make_room(self) -> None:
        """Wake one caller waiting for room (one that gave up waiting needs none)."""
        while self._room:  # bounded: each turn takes one waiter off
            room = self._room.popleft()
            if not room.done():
                room.set_result(None)
                return

    def renew_connections(self) -> None:
        """Each writer takes a fresh connection for its next batch (the ones they hold may be dead)."""
        self._generation += 1

    async def close(self) -> None:
        """Commit what is queued, then stop the writers; a write submitted after this is refused."""
        with self._lock:
            self._closing = True
            for wake in self._idle:
                wake.release()
            self._idle.clear()
            threads = list(self._threads)
        while self._room:  # the waiters find the database closed
            self._make_room()
        loop = asyncio.get_running_loop()
        for thread in threads:
            # A writer hands its last batch back before it ends, so those callers hear first.
            await loop.run_in_executor(None, thread.join)


def _run(unit: _Unit, connection: Connection) -> None:
    if unit.future.cancelled():  # its caller gave up before it ran (a read of a flag set on the loop)
        return
    try:
        unit.outcome = unit.context.run(unit.work, connection)
    except Exception as error:
        unit.error = error


# Between two units: the last one's savepoint goes, the next one's comes. PostgreSQL takes both in one
# round trip (psycopg sends a statement without parameters as a simple query); SQLite runs one at a time.
_NEXT_UNIT = {"postgresql": ("RELEASE SAVEPOINT quarry_unit; SAVEPOINT quarry_unit",)}
_NEXT_UNIT_ONE_AT_A_TIME = ("RELEASE SAVEPOINT quarry_unit", "SAVEPOINT quarry_unit")


def _in_savepoints(units: list[_Unit], connection: Connection) -> None:
    """Each unit inside a savepoint: a unit's failure takes back its own statements only. A failure to roll
    back to the savepoint leaves the transaction in doubt, and fails the batch. The last savepoint is left
    to the commit."""
    execute_on_driver(connection, "SAVEPOINT quarry_unit")
    for index, unit in enumerate(units):
        if index:
            for statement in _NEXT_UNIT.get(connection.dialect.name, _NEXT_UNIT_ONE_AT_A_TIME):
                execute_on_driver(connection, statement)
        _run(unit, connection)
        if unit.error is not None:
            execute_on_driver(connection, "ROLLBACK TO SAVEPOINT quarry_unit")


def execute_on_driver(connection: Connection, sql: str, parameters: Any = None, *, many: bool = False) -> Any:
    """Run `sql` in `connection`'s transaction on the driver's cursor, skipping SQLAlchemy's work per execution;
    errors are raised as SQLAlchemy's, as Connection.execute raises them. Returns what to fetch rows from."""
    if connection.dispatch.before_cursor_execute:
        # Someone watches statements (tracing's SQLAlchemy instrumentation): they go through SQLAlchemy.
        return connection.exec_driver_sql(sql, parameters)
    dialect = connection.dialect
    raw = connection.connection
    cursor = raw.cursor()
    try:
        if many:
            cursor.executemany(sql, parameters)
        elif parameters is None:
            cursor.execute(sql)
        else:
            cursor.execute(sql, parameters)
    except dialect.loaded_dbapi.Error as error:
        disconnected = dialect.is_disconnect(error, raw.dbapi_connection, cursor)
        if disconnected:
            connection.invalidate(error)
        raise sa.exc.DBAPIError.instance(
            sql,
            parameters,
            error,
            dialect.loaded_dbapi.Error,
            connection_invalidated=disconnected,
            dialect=dialect,
        ) from error
    return cursor
