"""The shared research plane in domain terms: scratchpad threads and entries as quarry.vocabulary types.

Agents, the worker and the supervisor read and write the scratchpad through this,
so their code never holds a protobuf; ScratchpadClient below it speaks quarry.v1
and carries the retry rules.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from quarry.clients.scratchpad import ScratchpadClient
from quarry.convert import ENTRY_KINDS, entry_from_proto, principal_to_proto, source_to_proto
from quarry.identity import Principal
from quarry.recording import replay_in_force
from quarry.records.research import entry_preview
from quarry.v1 import scratchpad_pb2
from quarry.vocabulary import Entry, EntryKind, Source

__all__ = ["Appended", "ResearchPlane"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Appended:
    entry: Entry
    replayed: bool  # the request_id had been appended before: nothing new was written


# Threads whose entries a process keeps; the least recently read is dropped first.
CACHED_THREADS = 64


@dataclass
class _Read:
    """What this process has read of a thread: every readable entry up to `through`, in order."""

    entries: list[Entry]
    through: int


class ResearchPlane:
    def __init__(self, client: ScratchpadClient) -> None:
        self._client = client
        self._read: OrderedDict[str, _Read] = OrderedDict()

    async def create_thread(self, thread_id: str, *, title: str, request_id: str) -> None:
        await self._client.create_thread(thread_id=thread_id, title=title, request_id=request_id)

    async def append(
        self,
        thread_id: str,
        *,
        kind: EntryKind,
        author: Principal,
        content: str,
        request_id: str,
        sources: Sequence[Source] = (),
    ) -> Appended:
        # A replay puts the appends of parallel agents in their recorded order (quarry.replay.source).
        replay = replay_in_force()
        if replay is not None:
            entry_kind = scratchpad_pb2.EntryKind.Name(ENTRY_KINDS.to_proto(kind))
            await replay.before_append(author.principal_id, entry_kind, content, entry_preview(kind, content))
        response = await self._client.append(
            thread_id,
            kind=ENTRY_KINDS.to_proto(kind),
            author=principal_to_proto(author),
            content=content,
            sources=[source_to_proto(source) for source in sources],
            request_id=request_id,
        )
        if replay is not None:
            replay.appended(response.entry.sequence_no)
        return Appended(entry_from_proto(response.entry), response.replayed)

    async def read_all(self, thread_id: str, *, after_sequence_no: int = 0) -> list[Entry]:
        """Every entry committed after `after_sequence_no`.

        Entries never change and their numbers have no gaps, so what was read once is kept and only
        what came after it is asked for: an agent that re-reads the scratchpad every turn is sent each
        entry once, not once a turn.
        """
        known = self._read.get(thread_id) or _Read([], 0)
        messages = await self._client.read_all(thread_id, after_sequence_no=known.through)
        known = self._read.setdefault(thread_id, known)  # another read may have stored it meanwhile
        for message in messages:
            if message.sequence_no > known.through:  # a concurrent read of the same thread added it already
                entry = _readable(message)
                if entry is not None:
                    known.entries.append(entry)
                known.through = message.sequence_no
        self._read.move_to_end(thread_id)
        while len(self._read) > CACHED_THREADS:
            self._read.popitem(last=False)
        return [entry for entry in known.entries if entry.sequence_no > after_sequence_no]

    async def watch(self, thread_id: str, *, after_sequence_no: int = 0) -> AsyncIterator[Entry]:
        async for message in self._client.watch(thread_id, after_sequence_no=after_sequence_no):
            entry = _readable(message)
            if entry is not None:
                yield entry


def _readable(message: scratchpad_pb2.Entry) -> Entry | None:
    """The entry, or None for one of a kind or role this build does not know (a newer scratchpad's):
    nothing here could act on it, and it must not fail the reader."""
    try:
        return entry_from_proto(message)
    except ValueError as error:
        log.warning("scratchpad entry skipped: %s", error)
        return None
