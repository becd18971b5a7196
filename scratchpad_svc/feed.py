"""Committed entries handed to watchers: fanned out in-process, and carried to other replicas in NOTIFY payloads.

A commit numbers its entries first..last with no gaps. A watcher that has seen
everything up to `after` takes a delivered batch only when it continues from
there (first <= after + 1); anything else (a batch that skips ahead, a wake-up
without entries, a payload too large to carry them all) sends it back to the
committed rows, so a delivery can spare a read but never drop, reorder or repeat
an entry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from quarry.identity import Principal, Role
from quarry.notify import CommitFeed
from quarry.vocabulary import Entry, EntryKind, Source

# PostgreSQL refuses a NOTIFY payload of 8000 bytes or more; room is left for the last sequence number.
PAYLOAD_LIMIT = 8000 - 1 - 20


@dataclass(frozen=True)
class Committed:
    """One commit on a thread: `count` entries numbered up to `last`, of which `entries` are the first ones
    (all of them in-process; in a payload, as many as fit)."""

    last: int
    count: int
    entries: tuple[Entry, ...]

    @property
    def first(self) -> int:
        return self.last - self.count + 1


EntryFeed = CommitFeed[Committed]


def continue_watch(after: int, batches: Sequence[Committed | None]) -> tuple[list[Entry], int, bool]:
    """The delivered entries that follow `after`, in order; the new `after`; and whether the watcher must
    read the committed rows again (the deliveries do not continue what it has seen)."""
    delivered: list[Entry] = []
    for batch in batches:
        if batch is None or batch.first > after + 1:
            return delivered, after, True
        if batch.last <= after:
            continue  # already seen: read back, or delivered twice
        delivered.extend(entry for entry in batch.entries if entry.sequence_no > after)
        after = max(after, batch.first - 1 + len(batch.entries))
        if after < batch.last:
            return delivered, after, True  # the payload carried only the first entries
    return delivered, after, False


@dataclass(frozen=True)
class Payloads:
    """The NOTIFY payloads of one scratchpad process. `scope` (the PostgreSQL schema) keeps another
    deployment's threads, on the same database and channel, apart; `origin` marks this process's own."""

    scope: str
    origin: str

    def parts(self, thread_id: str, entries: Sequence[Entry]) -> tuple[str, str]:
        """The payload of a commit of `entries` (numbered in any way), as the text before and after its last
        sequence number, which the committing statement fills in. Entries that do not fit are left out."""
        head = (
            f'{self._own},"t":{json.dumps(thread_id)},'
            f'"n":{len(entries)},"c":{json.dumps(entries[0].create_time.isoformat() if entries else "")},"l":'
        )
        room = PAYLOAD_LIMIT - len(head.encode()) - len(',"e":[]}')
        encoded: list[str] = []
        for entry in entries:
            item = json.dumps(_entry_fields(entry), ensure_ascii=False, separators=(",", ":"))
            room -= len(item.encode()) + 1
            if room < 0:
                break
            encoded.append(item)
        return head, f',"e":[{",".join(encoded)}]}}'

    def payload(self, thread_id: str, entries: Sequence[Entry], last: int) -> str:
        head, tail = self.parts(thread_id, entries)
        return f"{head}{last}{tail}"

    @cached_property
    def _own(self) -> str:
        """How this process's payloads begin."""
        return f'{{"s":{json.dumps(self.scope)},"o":{json.dumps(self.origin)}'

    def decode(self, payload: str) -> tuple[str, Committed | None] | None:
        """Another process's commit as a thread id and a batch; None for this process's own, or another
        scope's. A bare thread id (as a release before payloads sent it) is a wake-up."""
        if not payload.startswith("{"):
            return payload, None
        if payload.startswith(self._own + ","):  # this process's own (every commit of it): not parsed
            return None
        try:
            fields = json.loads(payload)
            if fields["s"] != self.scope or fields["o"] == self.origin:
                return None
            thread_id, count, last, items = str(fields["t"]), int(fields["n"]), int(fields["l"]), fields["e"]
            entries: tuple[Entry, ...] = ()
            if items:
                create_time = datetime.fromisoformat(fields["c"])
                first = last - count + 1
                entries = tuple(_entry(thread_id, first + index, item, create_time) for index, item in enumerate(items))
        except (KeyError, TypeError, IndexError) as error:
            raise ValueError(f"not a scratchpad commit: {error}") from error
        return thread_id, Committed(last=last, count=count, entries=entries)


def _entry_fields(entry: Entry) -> list[Any]:
    sources = [[source.url, source.title, source.excerpt] for source in entry.sources]
    author = entry.author
    return [entry.request_id, entry.kind.value, author.principal_id, author.role.value, entry.content, sources]


def _entry(thread_id: str, sequence_no: int, item: list[Any], create_time: datetime) -> Entry:
    request_id, kind, author_id, role, content, sources = item
    return Entry(
        thread_id=thread_id,
        sequence_no=sequence_no,
        request_id=request_id,
        kind=EntryKind(kind),
        author=Principal(principal_id=author_id, role=Role(role)),
        content=content,
        sources=tuple(Source(url=url, title=title, excerpt=excerpt) for url, title, excerpt in sources),
        create_time=create_time,
    )
