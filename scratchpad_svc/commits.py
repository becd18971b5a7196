"""Wakes Watch streams when a thread gets new commits.

In-process, the appender publishes after each commit. Across replicas on
PostgreSQL, a LISTEN connection republishes the NOTIFY each commit sends. A
wake-up only says "read again": watchers always read committed rows, so a lost
or duplicated signal can delay an entry but never drop, reorder or repeat one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict

import psycopg
from sqlalchemy.engine import URL

from scratchpad_svc.store import NOTIFY_CHANNEL

log = logging.getLogger(__name__)


class CommitSignal:
    def __init__(self) -> None:
        self._waiters: defaultdict[str, set[asyncio.Future[None]]] = defaultdict(set)

    def subscribe(self, thread_id: str) -> asyncio.Future[None]:
        """A future resolved at the next commit to the thread. Subscribe before reading."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[thread_id].add(waiter)
        return waiter

    def unsubscribe(self, thread_id: str, waiter: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(thread_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[thread_id]

    def publish(self, thread_id: str) -> None:
        for waiter in self._waiters.pop(thread_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    def publish_all(self) -> None:
        for thread_id in list(self._waiters):
            self.publish(thread_id)


class PostgresCommitListener:
    """Relays NOTIFYs from other replicas into a CommitSignal, reconnecting with backoff."""

    def __init__(self, url: URL, signal: CommitSignal) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._signal = signal
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="scratchpad-commit-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as connection:
                    await connection.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self.connected.set()
                    delay = 0.1
                    # Commits may have happened while we were not listening.
                    self._signal.publish_all()
                    async for notify in connection.notifies():
                        self._signal.publish(notify.payload)
            except (psycopg.Error, OSError) as error:
                self.connected.clear()
                log.warning("commit listener lost its connection (%s); retrying in %.1fs", error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
