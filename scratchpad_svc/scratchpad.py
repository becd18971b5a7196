"""The scratchpad domain: validation, authority, group commit and watching."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from quarry import ids
from quarry.errors import ErrorReason, Internal, QuarryError, Unavailable
from quarry.identity import MeshRole
from quarry.notify import CommitFeed
from quarry.telemetry import meter, tracer
from quarry.vocabulary import Entry, EntryKind
from scratchpad_svc.authority import check_may_act_as, check_may_write, check_record_author
from scratchpad_svc.feed import EntryFeed, continue_watch
from scratchpad_svc.ledger import check_ledger_record
from scratchpad_svc.store import ScratchpadStore
from scratchpad_svc.threads import AppendCommand, AppendResult, NewThread, Thread
from scratchpad_svc.validation import (
    Limits,
    encode_page_token,
    read_cursor,
    validate_append,
    validate_new_thread,
)

log = logging.getLogger(__name__)

WATCH_BATCH = 500


@dataclass(frozen=True)
class ReadPage:
    entries: list[Entry]
    next_page_token: str
    last_sequence_no: int


@dataclass
class _Pending:
    command: AppendCommand
    future: asyncio.Future[AppendResult]
    # The caller's context: its batch's database work is traced under the first caller's span.
    context: contextvars.Context


_APPENDS = meter.create_counter("quarry.scratchpad.appends", description="entries appended, by kind")


class ScratchpadClosed(Unavailable):
    def __init__(self) -> None:
        super().__init__("the scratchpad is shutting down; reconnect", reason=ErrorReason.SHUTTING_DOWN)


class Scratchpad:
    """Owns the scratchpad's behaviour; the servicer only translates protos to calls here."""

    def __init__(
        self,
        store: ScratchpadStore,
        limits: Limits,
        *,
        max_batch: int = 256,
        write_concurrency: int = 4,
        watch_poll_seconds: float = 5.0,
    ) -> None:
        self._store = store
        self._limits = limits
        # Each commit's entries go to this process's watchers; a listener adds other replicas' commits.
        self.feed: EntryFeed = CommitFeed(store.payloads.decode)
        self._max_batch = max_batch
        # How long a watcher waits without a wake-up before it reads again anyway:
        # a safety net for a lost notification, not the delivery path.
        self._watch_poll_seconds = watch_poll_seconds
        self._write_slots = asyncio.Semaphore(write_concurrency)
        self._pending: defaultdict[str, deque[_Pending]] = defaultdict(deque)
        self._flushers: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    async def create_thread(self, request: NewThread) -> Thread:
        validate_new_thread(request)
        return await self._store.create_thread(request)

    async def get_thread(self, thread_id: str) -> Thread:
        ids.THREAD_ID.require("thread_id", thread_id)
        return await self._store.get_thread(thread_id)

    async def append(self, command: AppendCommand, caller: MeshRole | None = None) -> AppendResult:
        """Validate, check authority, then commit with whatever else is queued for the thread.

        `caller` is the authenticated mesh role of whoever sent it: the author role must be one it holds.
        """
        attributes = {"quarry.thread_id": command.thread_id, "quarry.entry.kind": str(command.kind)}
        with tracer.start_as_current_span("scratchpad append", attributes=attributes) as span:
            result = await self._append(command, caller)
            span.set_attributes({"quarry.sequence_no": result.entry.sequence_no, "quarry.replayed": result.replayed})
        _APPENDS.add(1, {"quarry.entry.kind": str(result.entry.kind), "quarry.replayed": result.replayed})
        return result

    async def _append(self, command: AppendCommand, caller: MeshRole | None) -> AppendResult:
        record = validate_append(command, self._limits)
        assert command.role is not None and command.kind is not None
        check_may_act_as(caller, command.role)
        check_may_write(command.role, command.kind)
        if record is not None:
            check_record_author(command.role, record)
            await check_ledger_record(self._store, command, record)
        if self._closed:
            raise ScratchpadClosed()
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        item = _Pending(command, future, contextvars.copy_context())
        if self._store.commits_without_yielding and command.thread_id not in self._flushers:
            # Nothing is queued for the thread, and the commit ends before anything else runs: nothing can
            # queue behind it, so it commits here, without a flusher task and a hand-off back to this one.
            await self._commit(command.thread_id, [item])
            return await future
        self._pending[command.thread_id].append(item)
        if command.thread_id not in self._flushers:
            # A context of its own: the flusher outlives the append that started it.
            self._flushers[command.thread_id] = asyncio.create_task(
                self._flush(command.thread_id), context=contextvars.Context()
            )
        return await future

    async def _flush(self, thread_id: str) -> None:
        """Commit queued appends of one thread, a batch per transaction, until none are left.

        One flusher per thread per process, so appends to a thread never contend
        with each other here; replicas serialise on the counter row instead.
        """
        queue = self._pending[thread_id]
        try:
            while queue:
                batch = [queue.popleft() for _ in range(min(len(queue), self._max_batch))]
                batch = [item for item in batch if not item.future.done()]  # drop cancelled callers
                if batch:
                    async with self._write_slots:
                        await self._commit(thread_id, batch)
        finally:
            # Only a cancelled flusher leaves items behind; their callers must not wait forever.
            self._fail(list(queue), ScratchpadClosed())
            del self._flushers[thread_id]
            del self._pending[thread_id]

    async def _commit(self, thread_id: str, batch: list[_Pending]) -> None:
        """Commit one batch and answer its callers. Never raises."""
        try:
            # In the first caller's context: the batch's statements are traced under its span.
            commands = [item.command for item in batch]
            outcome = await self._store.append_batch(thread_id, commands, context=batch[0].context)
        except QuarryError as error:  # the thread is missing, or the database is unavailable
            self.feed.publish(thread_id)  # it may have committed all the same: watchers read again
            self._fail(batch, error)
            return
        except Exception:
            if len(batch) > 1:
                # Something in the batch broke the statement: commit each alone, so
                # only the culprit fails.
                for item in batch:
                    await self._commit(thread_id, [item])
                return
            log.exception("append to thread %s failed", thread_id)
            self.feed.publish(thread_id)
            self._fail(batch, Internal("the append could not be committed"))
            return
        committed = outcome.committed()
        if committed is not None:
            self.feed.publish(thread_id, committed)
        for item, result in zip(batch, outcome.results, strict=True):
            if item.future.done():
                continue
            if isinstance(result, QuarryError):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    @staticmethod
    def _fail(batch: Sequence[_Pending], error: QuarryError) -> None:
        for item in batch:
            if not item.future.done():
                item.future.set_exception(error)

    async def read(
        self,
        thread_id: str,
        *,
        after_sequence_no: int = 0,
        page_size: int = 0,
        page_token: str = "",
        kinds: Sequence[EntryKind] | None = None,
    ) -> ReadPage:
        cursor = read_cursor(thread_id, after_sequence_no, page_size, page_token)
        entries, last = await self._store.read(thread_id, cursor.after_sequence_no, cursor.limit, kinds)
        # The page is full, or kind filtering skipped rows: more may follow up to `last`.
        scanned_to = entries[-1].sequence_no if entries else last
        more = len(entries) == cursor.limit and scanned_to < last
        return ReadPage(
            entries=entries,
            next_page_token=encode_page_token(thread_id, scanned_to) if more else "",
            last_sequence_no=last,
        )

    async def open_watch(
        self, thread_id: str, *, after_sequence_no: int = 0, kinds: Sequence[EntryKind] | None = None
    ) -> AsyncIterator[Entry]:
        """Check the request and the thread now, then return the stream of entries.

        The stream yields the committed backlog after `after_sequence_no`, then
        each new commit, until the caller stops iterating or the scratchpad closes.
        """
        cursor = read_cursor(thread_id, after_sequence_no, WATCH_BATCH, "")
        await self._store.get_thread(thread_id)
        return self._watch(thread_id, cursor.after_sequence_no, kinds)

    async def _watch(self, thread_id: str, after: int, kinds: Sequence[EntryKind] | None) -> AsyncIterator[Entry]:
        """Read the committed rows, then take each commit as delivered while deliveries continue from the
        last entry seen; read again when one does not, or when none came for a while."""
        wanted = None if kinds is None else frozenset(kinds)
        # Subscribed before the first read, so no commit after it goes undelivered.
        deliveries = self.feed.subscribe(thread_id)
        try:
            read = True
            while not self._closed:
                if read:
                    entries, last = await self._store.read(thread_id, after, WATCH_BATCH, kinds)
                    for entry in entries:
                        yield entry
                    if len(entries) == WATCH_BATCH:
                        after = entries[-1].sequence_no
                        continue
                    # A kind filter can skip rows: resume after everything scanned.
                    after = max(after, last)
                batches = await deliveries.take(self._watch_poll_seconds)
                delivered, after, read = continue_watch(after, batches)
                for entry in delivered:
                    if wanted is None or entry.kind in wanted:
                        yield entry
                read = read or not batches  # nothing for a whole poll interval: a signal may have been lost
        finally:
            self.feed.unsubscribe(thread_id, deliveries)
        raise ScratchpadClosed()

    async def close(self) -> None:
        """Stop taking appends, let queued ones commit, and end every Watch."""
        self._closed = True
        self.feed.publish_all()
        flushers = list(self._flushers.values())
        if flushers:
            await asyncio.gather(*flushers, return_exceptions=True)
