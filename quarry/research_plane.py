"""The shared research plane in domain terms: scratchpad threads and entries as quarry.vocabulary types.

Agents, the worker and the supervisor read and write the scratchpad through this,
so their code never holds a protobuf; ScratchpadClient below it speaks quarry.v1
and carries the retry rules.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from quarry.client import ScratchpadClient
from quarry.convert import ENTRY_KINDS, entry_from_proto, principal_to_proto, source_to_proto
from quarry.identity import Principal
from quarry.vocabulary import Entry, EntryKind, Source

__all__ = ["Appended", "ResearchPlane"]


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
        return [entry_from_proto(entry) for entry in entries]

    async def watch(self, thread_id: str, *, after_sequence_no: int = 0) -> AsyncIterator[Entry]:
        async for entry in self._client.watch(thread_id, after_sequence_no=after_sequence_no):
            yield entry_from_proto(entry)
