"""The shared research plane in domain terms: scratchpad threads and entries as quarry.vocabulary types.

Agents, the worker and the supervisor read and write the scratchpad through this,
so their code never holds a protobuf; ScratchpadClient below it speaks quarry.v1
and carries the retry rules.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from quarry.client import ScratchpadClient
from quarry.convert import ENTRY_KINDS, entry_from_proto, principal_to_proto, source_to_proto
from quarry.identity import Principal
from quarry.v1 import scratchpad_pb2
from quarry.vocabulary import Entry, EntryKind, Source

__all__ = ["Appended", "ResearchPlane"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Appended:
    entry: Entry
    replayed: bool  # the request_id had been appended before: nothing new was written


class ResearchPlane:
    def __init__(self, client: ScratchpadClient) -> None:
        self._client = client

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
        response = await self._client.append(
            thread_id,
            kind=ENTRY_KINDS.to_proto(kind),
            author=principal_to_proto(author),
            content=content,
            sources=[source_to_proto(source) for source in sources],
            request_id=request_id,
        )
        return Appended(entry_from_proto(response.entry), response.replayed)

    async def read_all(self, thread_id: str, *, after_sequence_no: int = 0) -> list[Entry]:
        entries = await self._client.read_all(thread_id, after_sequence_no=after_sequence_no)
        return [entry for entry in map(_readable, entries) if entry is not None]

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
