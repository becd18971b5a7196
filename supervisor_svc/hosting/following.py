"""Following an event log to its end, the loop StreamRun and StreamCampaign share, and the writer that
wakes the followers.

A follower reads what committed after a sequence number, sends it, and waits for the next commit
(or the poll interval, a safety net) until the log's terminal event; a stream that resumes after
the terminal event ends at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from quarry import telemetry
from quarry.errors import ErrorReason, Unavailable
from quarry.notify import CommitSignal
from supervisor_svc.hosting.store import StoredEvent

_T = TypeVar("_T")

# How long a stream waits out its database's outage before it ends UNAVAILABLE (the client re-attaches).
OUTAGE_WAIT_SECONDS = 30.0


class _State(Protocol):
    @property
    def ended(self) -> bool: ...


class _Record(Protocol):
    @property
    def state(self) -> _State: ...


class EventLog(Protocol):
    """A store of keyed event logs (runs, campaigns)."""

    async def events_after(self, key: str, after: int, limit: int = ...) -> list[StoredEvent]: ...

    async def get(self, key: str, /) -> _Record | None: ...


@dataclass
class Follower:
    signal: CommitSignal
    closing: asyncio.Event  # set when the supervisor shuts down: waiting streams end UNAVAILABLE
    poll_seconds: float

    async def follow(self, log: EventLog, key: str, after: int) -> AsyncIterator[StoredEvent]:
        ended = False
        while True:
            woken = self.signal.subscribe(key)  # before the read, so no commit after it goes unnoticed
            try:
                batch, record = await self._read(log, key, after)
                if not batch and record is not None and not record.state.ended:
                    await self._wait(woken)
            finally:
                self.signal.unsubscribe(key, woken)
            if not batch:
                if record is None or record.state.ended:
                    if ended:
                        return  # resumed after the terminal event: there is nothing more to send
                    ended = True  # one more read: the end may have committed after the last one
                continue
            for stored in batch:
                yield stored
                after = stored.sequence_no
                if stored.terminal:
                    return

    async def _read(self, log: EventLog, key: str, after: int) -> tuple[list[StoredEvent], _Record | None]:
        """The events after `after` (and, when there are none, the record), waiting out a database outage
        of up to OUTAGE_WAIT_SECONDS; past it UNAVAILABLE, naming the sequence number to re-attach after."""
        loop = asyncio.get_running_loop()
        until = loop.time() + OUTAGE_WAIT_SECONDS
        delay = 0.25
        while True:
            try:
                with telemetry.quiet():  # a stream's re-reads are not worth a span each
                    batch = await log.events_after(key, after)
                    return batch, None if batch else await log.get(key)
            except Unavailable as error:
                if self.closing.is_set() or loop.time() + delay > until:
                    raise reattach_after(error, after) from error
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _wait(self, woken: asyncio.Future[None]) -> None:
        """Until a commit wakes the stream, the poll interval passes, or the supervisor shuts down."""
        if self.closing.is_set():
            raise Unavailable("the supervisor is shutting down; re-attach to another", reason=ErrorReason.SHUTTING_DOWN)
        closing: asyncio.Future[Any] = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait({closing, woken}, timeout=self.poll_seconds, return_when="FIRST_COMPLETED")
        finally:
            closing.cancel()


def reattach_after(error: Unavailable, after: int) -> Unavailable:
    """`error` for a stream's client, with where to re-attach: the last sequence number it was sent."""
    return Unavailable(
        f"{error.message}; re-attach with after_sequence_no={after}",
        reason=error.reason,
        metadata={**error.metadata, "after_sequence_no": str(after)},
    )


class EventLogWriter:
    """The writes of one piece of work to its event log: one at a time, in call order; each then wakes the
    work's streams (here at once; on other replicas by the NOTIFY the write committed). A write that failed
    wakes them too, which only costs each stream a re-read."""

    def __init__(self, bus: CommitSignal, key: str) -> None:
        self._bus = bus
        self._key = key
        self._lock = asyncio.Lock()

    async def write(self, write: Callable[[], Awaitable[_T]]) -> _T:
        async with self._lock:
            try:
                return await write()
            finally:
                self._bus.publish(self._key)
