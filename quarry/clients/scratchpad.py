"""The scratchpad's client: threads, appends once in effect, reads and watches that resume."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from operator import attrgetter

import grpc

from quarry.clients.retry import RetryPolicy
from quarry.streams import ResumePolicy, resumable_stream
from quarry.v1 import common_pb2, scratchpad_pb2, scratchpad_pb2_grpc

__all__ = ["ScratchpadClient"]


class ScratchpadClient:
    def __init__(self, channel: grpc.aio.Channel, retry: RetryPolicy | None = None) -> None:
        self._stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
        self._retry = retry or RetryPolicy()

    async def create_thread(
        self, *, thread_id: str = "", title: str = "", labels: dict[str, str] | None = None, request_id: str = ""
    ) -> scratchpad_pb2.Thread:
        request = scratchpad_pb2.CreateThreadRequest(
            thread_id=thread_id, title=title, labels=labels or {}, request_id=request_id or str(uuid.uuid4())
        )
        response: scratchpad_pb2.CreateThreadResponse = await self._retry.call(self._stub.CreateThread, request)
        return response.thread

    async def get_thread(self, thread_id: str) -> scratchpad_pb2.Thread:
        request = scratchpad_pb2.GetThreadRequest(thread_id=thread_id)
        response: scratchpad_pb2.GetThreadResponse = await self._retry.call(self._stub.GetThread, request)
        return response.thread

    async def append(
        self,
        thread_id: str,
        *,
        kind: scratchpad_pb2.EntryKind.ValueType,
        author: common_pb2.Principal,
        content: str,
        sources: Sequence[common_pb2.Source] = (),
        request_id: str = "",
    ) -> scratchpad_pb2.AppendResponse:
        """Append once in effect: retries reuse the request_id, so a lost reply never duplicates."""
        request = scratchpad_pb2.AppendRequest(
            thread_id=thread_id,
            request_id=request_id or str(uuid.uuid4()),
            kind=kind,
            author=author,
            content=content,
            sources=sources,
        )
        response: scratchpad_pb2.AppendResponse = await self._retry.call(self._stub.Append, request)
        return response

    async def read_all(
        self, thread_id: str, *, after_sequence_no: int = 0, page_size: int = 1000
    ) -> list[scratchpad_pb2.Entry]:
        """Every entry committed after `after_sequence_no`, following pages to the end."""
        entries: list[scratchpad_pb2.Entry] = []
        token = ""
        while True:
            request = scratchpad_pb2.ReadRequest(
                thread_id=thread_id, after_sequence_no=after_sequence_no, page_size=page_size, page_token=token
            )
            page: scratchpad_pb2.ReadResponse = await self._retry.call(self._stub.Read, request)
            entries.extend(page.entries)
            token = page.next_page_token
            if not token:
                return entries

    async def watch(
        self,
        thread_id: str,
        *,
        after_sequence_no: int = 0,
        max_reconnects: int = 100,
        on_established: Callable[[], None] | None = None,
    ) -> AsyncIterator[scratchpad_pb2.Entry]:
        """Entries as they commit; reconnects after UNAVAILABLE from the last one received.

        `on_established` is called each time the service has accepted the stream,
        before any entry arrives: from then on no commit can be missed.
        """

        async def open_after(after: int) -> AsyncIterator[scratchpad_pb2.Entry]:
            call = self._stub.Watch(scratchpad_pb2.WatchRequest(thread_id=thread_id, after_sequence_no=after))
            await call.initial_metadata()
            if on_established is not None:
                on_established()
            return (response.entry async for response in call)

        entries = resumable_stream(
            open_after,
            attrgetter("sequence_no"),
            after=after_sequence_no,
            # Waits, with backoff, until the service answers again.
            wait_until_back=lambda: self.get_thread(thread_id),
            policy=ResumePolicy(max_reconnects=max_reconnects),
        )
        async for entry in entries:
            yield entry
