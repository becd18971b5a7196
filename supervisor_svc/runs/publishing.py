"""What one run tells its clients: status, scratchpad entries (each once), streamed text and its ending.

Every event goes through the run's RunEventLog, which numbers and stores events in
call order and then wakes the run's streams through a quarry.notify.CommitSignal
keyed by run id (and, on PostgreSQL, by NOTIFYs from other replicas).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from quarry.notify import CommitSignal
from quarry.records.verification import Verification
from quarry.research_plane import ResearchPlane
from quarry.vocabulary import DelegationResult, Entry
from supervisor_svc.hosting.following import EventLogWriter
from supervisor_svc.runs import events
from supervisor_svc.runs.domain import Report, ResearchPhase, RunOutcome, RunUsage
from supervisor_svc.runs.events import PublicEvent
from supervisor_svc.runs.store import RunStore

log = logging.getLogger(__name__)


class RunEventLog:
    """One run's writer: one write at a time, in call order; each wakes the run's streams."""

    def __init__(self, store: RunStore, bus: CommitSignal, run_id: str) -> None:
        self._store = store
        self._run_id = run_id
        self._writer = EventLogWriter(bus, run_id)

    @property
    def store(self) -> RunStore:
        return self._store

    async def write(self, write: Callable[[], Awaitable[None]]) -> None:
        await self._writer.write(write)

    async def emit(self, *batch: PublicEvent) -> None:
        await self.write(lambda: self._store.append(self._run_id, batch))

    async def mark_running(self, event: PublicEvent) -> None:
        await self.write(lambda: self._store.mark_running(self._run_id, event))

    async def record_usage(self, event: PublicEvent, usage: RunUsage) -> None:
        await self.write(lambda: self._store.record_usage(self._run_id, event, usage))

    async def record_verification(self, event: PublicEvent, verification: Verification) -> None:
        await self.write(lambda: self._store.record_verification(self._run_id, event, verification))

    async def await_approval(self, event: PublicEvent, report: Report, verification: Verification | None) -> None:
        await self.write(lambda: self._store.await_approval(self._run_id, event, report, verification))

    async def finish(self, outcome: RunOutcome) -> None:
        await self.write(lambda: self._store.finish(self._run_id, outcome))


class TextStream:
    """Coalesces streamed text into events of a useful size: one per ~200 characters or 100 ms."""

    def __init__(
        self,
        make: Callable[[str], PublicEvent],
        emit: Callable[[PublicEvent], Awaitable[None]],
        *,
        max_chars: int = 200,
        max_delay: float = 0.1,
    ) -> None:
        self._make = make
        self._emit = emit
        self._max_chars = max_chars
        self._max_delay = max_delay
        self._buffer: list[str] = []
        self._size = 0
        self._since = 0.0

    async def add(self, text: str) -> None:
        if not text:
            return
        if not self._buffer:
            self._since = time.monotonic()
        self._buffer.append(text)
        self._size += len(text)
        if self._size >= self._max_chars or time.monotonic() - self._since >= self._max_delay:
            await self.flush()

    async def flush(self) -> None:
        if self._buffer:
            text = "".join(self._buffer)
            self._buffer.clear()
            self._size = 0
            await self._emit(self._make(text))


class RunPublisher:
    """The events of one run, in the order they happen; the terminal one last."""

    def __init__(self, event_log: RunEventLog, scratchpad: ResearchPlane, run_id: str, thread_id: str) -> None:
        self._log = event_log
        self._scratchpad = scratchpad
        self._run_id = run_id
        self._thread_id = thread_id
        self.reasoning = TextStream(events.reasoning, self._log.emit)
        self.content = TextStream(events.content, self._log.emit)
        self._entries_published = 0
        self._entries_lock = asyncio.Lock()

    @property
    def store(self) -> RunStore:
        return self._log.store

    def resume_after(self, entry_sequence_no: int) -> None:
        """Entries up to this one were reported (by the process that began the run)."""
        self._entries_published = entry_sequence_no

    async def started(self) -> None:
        await self._log.mark_running(events.status(ResearchPhase.STARTED, "research started"))

    async def status(self, phase: ResearchPhase, message: str, *, delegation_id: str = "", worker_id: str = "") -> None:
        await self._log.emit(events.status(phase, message, delegation_id=delegation_id, worker_id=worker_id))

    async def delegation_ended(self, result: DelegationResult, usage: RunUsage) -> None:
        await self._log.record_usage(events.delegation_ended(result), usage)

    async def verification(self, phase: ResearchPhase, message: str, verification: Verification) -> None:
        """A verification step, after which GetRun shows `verification` as the run's so far."""
        await self._log.record_verification(events.status(phase, message), verification)

    async def awaiting_approval(self, message: str, report: Report, verification: Verification | None) -> None:
        event = events.status(ResearchPhase.AWAITING_APPROVAL, message)
        await self._log.await_approval(event, report, verification)

    async def finish(self, outcome: RunOutcome) -> None:
        await self._log.finish(outcome)

    # -- scratchpad entries -----------------------------------------------------------------

    async def entries(self, entries: Sequence[Entry]) -> None:
        """Scratchpad events for entries not yet reported, in sequence order, each once."""
        async with self._entries_lock:
            fresh = [entry for entry in entries if entry.sequence_no > self._entries_published]
            if fresh:
                await self._log.emit(*(events.scratchpad_entry(entry) for entry in fresh))
                self._entries_published = fresh[-1].sequence_no

    async def follow_scratchpad(self) -> None:
        """Publish entries as they commit, until cancelled; a broken watch only stops the live updates."""
        try:
            async for entry in self._scratchpad.watch(self._thread_id):
                # Shielded: an event stored but not yet counted would be published twice by catch_up.
                await asyncio.shield(self.entries([entry]))
        except Exception as error:  # the final catch_up still reports every entry
            log.warning("run %s: scratchpad watch ended: %s", self._run_id, error)

    async def catch_up(self, within: float | None = None) -> None:
        """Report the entries the watch has not, giving the scratchpad at most `within` seconds: the run's
        end must not wait on, or fail with, the scratchpad."""
        try:
            # Only the read is bounded: an event write cut short could still commit.
            async with asyncio.timeout(within):
                entries = await self._scratchpad.read_all(self._thread_id, after_sequence_no=self._entries_published)
            await self.entries(entries)
        except Exception as error:
            log.warning("run %s: could not report the last scratchpad entries: %s", self._run_id, error)
