"""Single-statement PostgreSQL writes on connections the event loop owns (psycopg's async driver).

A statement that is its own transaction (autocommit) needs no thread: the loop sends
it, waits for its socket like any other, and the caller resumes when the server has
committed it. That spares the hop to a writer thread and back and SQLAlchemy's
connection checkout (measured on the 2-core machine: about half of a sequential
append's time beyond its commit). One statement runs on a connection at a time;
up to `size` connections run at once, each opened on first need and kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL, Dialect

__all__ = ["LoopStatements"]


class LoopStatements:
    """Up to `size` autocommit connections to the database at `url`, each prepared with `session_setup`."""

    def __init__(self, url: URL, dialect: Dialect, *, size: int, session_setup: str) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, not {size}")
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._dialect = dialect
        self._setup = session_setup
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._slots = asyncio.Semaphore(size)
        self._closed = False
        self._closing: set[asyncio.Future[None]] = set()

    async def first_row(self, sql: str, parameters: Mapping[str, Any] | tuple[Any, ...]) -> tuple[Any, ...] | None:
        """Run `sql` as its own transaction; its first row (None when it returns none) once it has committed.
        Errors are raised as SQLAlchemy's (an IntegrityError, an OperationalError when the server is out of
        reach), as Connection.execute raises them."""
        async with self._slots:
            if self._closed:
                raise sa.exc.InterfaceError(sql, parameters, psycopg.InterfaceError("the database is closed"))
            connection = self._idle.pop() if self._idle else None
            try:
                if connection is None or connection.closed:
                    connection = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                    await connection.execute(self._setup)
                cursor = await connection.execute(sql, parameters)
                row = await cursor.fetchone() if cursor.description is not None else None
            except psycopg.Error as error:
                await self._discard_if_broken(connection)
                raise sa.exc.DBAPIError.instance(
                    sql, parameters, error, psycopg.Error, dialect=self._dialect
                ) from error
            except BaseException:
                # Cancelled mid-statement: the connection's state is unknown, so it goes.
                await self._discard(connection)
                raise
            if self._closed:
                await connection.close()
            else:
                self._idle.append(connection)
            return row

    async def _discard_if_broken(self, connection: psycopg.AsyncConnection[Any] | None) -> None:
        """Keep a connection whose statement failed on its own (a constraint); drop any other."""
        if connection is not None and not connection.broken and not connection.closed and not self._closed:
            self._idle.append(connection)
        else:
            await self._discard(connection)

    @staticmethod
    async def _discard(connection: psycopg.AsyncConnection[Any] | None) -> None:
        if connection is not None:
            await connection.close()

    def drop_idle(self) -> None:
        """Forget the idle connections (after an outage they are dead): each is closed in the background, and
        the next statements connect afresh."""
        idle, self._idle = self._idle, []
        for connection in idle:
            task = asyncio.ensure_future(connection.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close the idle connections; one in use closes when its statement ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.close()
