"""ScratchpadService over gRPC: translates quarry.v1 messages to Scratchpad calls and back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from quarry.convert import ENTRY_KINDS, ROLES, entry_to_proto, source_from_proto, timestamp
from quarry.mesh_auth import current_caller
from quarry.v1 import scratchpad_pb2, scratchpad_pb2_grpc
from quarry.vocabulary import EntryKind
from scratchpad_svc.scratchpad import Scratchpad
from scratchpad_svc.threads import AppendCommand, NewThread, Thread


def thread_to_proto(thread: Thread) -> scratchpad_pb2.Thread:
    return scratchpad_pb2.Thread(
        thread_id=thread.thread_id,
        title=thread.title,
        labels=thread.labels,
        create_time=timestamp(thread.create_time),
        last_sequence_no=thread.last_sequence_no,
    )


def _kinds(numbers: Sequence[int]) -> list[EntryKind] | None:
    """No filter when the request names no kind; kinds this build does not know match nothing."""
    return ENTRY_KINDS.known(numbers) if numbers else None


class ScratchpadServicer(scratchpad_pb2_grpc.ScratchpadServiceServicer):
    def __init__(self, scratchpad: Scratchpad) -> None:
        self._scratchpad = scratchpad

    async def CreateThread(
        self, request: scratchpad_pb2.CreateThreadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scratchpad_pb2.CreateThreadResponse:
        thread = await self._scratchpad.create_thread(
            NewThread(
                thread_id=request.thread_id,
                title=request.title,
                labels=dict(request.labels),
                request_id=request.request_id,
            )
        )
        return scratchpad_pb2.CreateThreadResponse(thread=thread_to_proto(thread))

    async def GetThread(
        self, request: scratchpad_pb2.GetThreadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scratchpad_pb2.GetThreadResponse:
        thread = await self._scratchpad.get_thread(request.thread_id)
        return scratchpad_pb2.GetThreadResponse(thread=thread_to_proto(thread))

    async def Append(
        self, request: scratchpad_pb2.AppendRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scratchpad_pb2.AppendResponse:
        result = await self._scratchpad.append(
            AppendCommand(
                thread_id=request.thread_id,
                request_id=request.request_id,
                kind=ENTRY_KINDS.from_proto(request.kind),
                author_id=request.author.principal_id,
                role=ROLES.from_proto(request.author.role),
                content=request.content,
                sources=tuple(source_from_proto(source) for source in request.sources),
            ),
            caller=current_caller(),
        )
        return scratchpad_pb2.AppendResponse(entry=entry_to_proto(result.entry), replayed=result.replayed)

    async def Read(
        self, request: scratchpad_pb2.ReadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scratchpad_pb2.ReadResponse:
        page = await self._scratchpad.read(
            request.thread_id,
            after_sequence_no=request.after_sequence_no,
            page_size=request.page_size,
            page_token=request.page_token,
            kinds=_kinds(request.kinds),
        )
        return scratchpad_pb2.ReadResponse(
            entries=[entry_to_proto(entry) for entry in page.entries],
            next_page_token=page.next_page_token,
            last_sequence_no=page.last_sequence_no,
        )

    async def Watch(
        self, request: scratchpad_pb2.WatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[scratchpad_pb2.WatchResponse]:
        entries = await self._scratchpad.open_watch(
            request.thread_id,
            after_sequence_no=request.after_sequence_no,
            kinds=_kinds(request.kinds),
        )
        # Headers now tell the client the watch is established, before any entry exists.
        await context.send_initial_metadata(())
        async for entry in entries:
            yield scratchpad_pb2.WatchResponse(entry=entry_to_proto(entry))
