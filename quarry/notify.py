"""Wakes streams when what they follow gets new commits (a scratchpad thread, a run's events).

In-process, the writer publishes after each commit. Across replicas on
PostgreSQL, a LISTEN connection republishes the NOTIFY each commit sends on a
channel. A CommitSignal's wake-up only says "read again": followers always read
committed rows, so a lost or duplicated signal can delay an item but never drop,
reorder or repeat one. A CommitFeed hands followers what was committed, so they
need not read it back; what it delivers is a hint of the same kind, and a
follower reads again whenever a delivery does not continue what it has seen.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection

from quarry.background import BackgroundTask
from quarry.db import Database

log = logging.getLogger(__name__)

_T = TypeVar("_T")


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

    def relay(self, payload: str) -> None:
        """A NOTIFY from another replica: its payload is the key."""
        self.publish(payload)


class FeedSubscription(Generic[_T]):
    """One follower's deliveries, oldest first: a committed batch, or None for "read again"."""

    def __init__(self, backlog: int) -> None:
        self._backlog = backlog
        self._pending: list[_T | None] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: _T | None) -> None:
        if len(self._pending) >= self._backlog:
            # A follower this far behind reads the rows anyway: hold nothing more for it.
            self._pending = [None]
        else:
            self._pending.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self, seconds: float) -> list[_T | None]:
        """Everything delivered so far, waiting up to `seconds` for the first; [] when none came."""
        if not self._pending:
            # A bare future: lighter than a task per wait (wait_for), and a delivery is on the hot path.
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait((self._waiter,), timeout=seconds)
            finally:
                self._waiter = None
        taken, self._pending = self._pending, []
        return taken


class CommitFeed(Generic[_T]):
    """Followers by key, each handed the batches committed under the key (a follower subscribes before
    it reads). `decode` turns another replica's NOTIFY payload into a key and a batch (None: only a
    wake-up), or None for one to ignore (this replica's own, already delivered)."""

    def __init__(self, decode: Callable[[str], tuple[str, _T | None] | None], *, backlog: int = 64) -> None:
        self._decode = decode
        self._backlog = backlog
        self._followers: defaultdict[str, set[FeedSubscription[_T]]] = defaultdict(set)

    def subscribe(self, key: str) -> FeedSubscription[_T]:
        subscription = FeedSubscription[_T](self._backlog)
        self._followers[key].add(subscription)
        return subscription

    def unsubscribe(self, key: str, subscription: FeedSubscription[_T]) -> None:
        followers = self._followers.get(key)
        if followers is not None:
            followers.discard(subscription)
            if not followers:
                del self._followers[key]

    def publish(self, key: str, batch: _T | None = None) -> None:
        """Deliver `batch` to the key's followers; None tells them to read again."""
        for subscription in self._followers.get(key, ()):
            subscription.put(batch)

    def publish_all(self) -> None:
        for key in list(self._followers):
            self.publish(key)

    def relay(self, payload: str) -> None:
        try:
            decoded = self._decode(payload)
        except ValueError:
            log.warning("undecodable commit notification %.200r", payload)
            return
        if decoded is not None:
            self.publish(*decoded)


class Relay(Protocol):
    """What a listener feeds: each NOTIFY's payload, and "read everything again" after it reconnects."""

    def relay(self, payload: str) -> None: ...

    def publish_all(self) -> None: ...


class PostgresCommitListener(BackgroundTask):
    """Relays NOTIFYs on one channel from other replicas into a CommitSignal or a CommitFeed, reconnecting
    with backoff."""

    def __init__(self, url: URL, channel: str, signal: Relay) -> None:
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
                        self._signal.relay(notify.payload)
            except (psycopg.Error, OSError) as error:
                self.connected.clear()
                log.warning("%s listener lost its connection (%s); retrying in %.1fs", self._channel, error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


def listen_for_commits(database: Database, channel: str, signal: Relay) -> PostgresCommitListener | None:
    """A started listener relaying other replicas' commits on `channel` into `signal` when `database` is
    PostgreSQL; None elsewhere, where this process is the only writer and publishes its own commits."""
    if not database.is_postgres:
        return None
    listener = PostgresCommitListener(database.url, channel, signal)
    listener.start()
    return listener
