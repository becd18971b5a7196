"""Wakes streams when what they follow gets new commits (a scratchpad thread, a run's events).

In-process, the writer publishes after each commit. Across replicas on
PostgreSQL, a LISTEN connection republishes the NOTIFY each commit sends on a
channel, with the key as its payload. A wake-up only says "read again":
followers always read committed rows, so a lost or duplicated signal can delay
an item but never drop, reorder or repeat one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection

from quarry.background import BackgroundTask
from quarry.db import Database

log = logging.getLogger(__name__)


def pg_notify(channel: str, key: sa.ColumnElement[str] | str) -> sa.ColumnElement[Any]:
    """The NOTIFY of `key` on `channel` as an SQL expression, for a statement that sends it along with
    its own work (PostgreSQL only; delivered when the transaction commits, and only if it does)."""
    return sa.func.pg_notify(channel, key)


def notify_on_commit(connection: Connection, channel: str, key: str) -> None:
    """Have the transaction on `connection` NOTIFY `key` on `channel` as it commits; nothing off PostgreSQL,
    where no other replica can be listening."""
    if connection.dialect.name == "postgresql":
        connection.execute(sa.select(pg_notify(channel, key)))


class CommitSignal:
    """Waiters by key (a thread id, a run id), woken by the next commit under that key."""

    def __init__(self) -> None:
        self._waiters: defaultdict[str, set[asyncio.Future[None]]] = defaultdict(set)

    def subscribe(self, key: str) -> asyncio.Future[None]:
        """A future resolved at the next commit under the key. Subscribe before reading."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[key].add(waiter)
        return waiter

    def unsubscribe(self, key: str, waiter: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[key]

    def publish(self, key: str) -> None:
        for waiter in self._waiters.pop(key, ()):
            if not waiter.done():
                waiter.set_result(None)

    def publish_all(self) -> None:
        for key in list(self._waiters):
            self.publish(key)


class PostgresCommitListener(BackgroundTask):
    """Relays NOTIFYs on one channel from other replicas into a CommitSignal, reconnecting with backoff."""

    def __init__(self, url: URL, channel: str, signal: CommitSignal) -> None:
        super().__init__(f"listener-{channel}")
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._channel = channel
        self._signal = signal
        self.connected = asyncio.Event()

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as connection:
                    await connection.execute(f"LISTEN {self._channel}")
                    self.connected.set()
                    delay = 0.1
                    # Commits may have happened while we were not listening.
                    self._signal.publish_all()
                    async for notify in connection.notifies():
                        self._signal.publish(notify.payload)
            except (psycopg.Error, OSError) as error:
                self.connected.clear()
                log.warning("%s listener lost its connection (%s); retrying in %.1fs", self._channel, error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


def listen_for_commits(database: Database, channel: str, signal: CommitSignal) -> PostgresCommitListener | None:
    """A started listener relaying other replicas' commits on `channel` into `signal` when `database` is
    PostgreSQL; None elsewhere, where this process is the only writer and publishes its own commits."""
    if not database.is_postgres:
        return None
    listener = PostgresCommitListener(database.url, channel, signal)
    listener.start()
    return listener
