"""The supervisor's runs: the public research API."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from operator import attrgetter

import grpc

from quarry.clients.channels import ApiClient
from quarry.clients.retry import RetryPolicy
from quarry.streams import ResumePolicy, resumable_stream
from quarry.v1 import scratchpad_pb2, supervisor_pb2, supervisor_pb2_grpc

__all__ = ["RunsClient", "is_terminal"]

_TERMINAL_EVENTS = frozenset({"completed", "failed", "cancelled"})


def is_terminal(event: supervisor_pb2.RunEvent) -> bool:
    """True for a run's last event: completed, failed or cancelled."""
    return event.WhichOneof("payload") in _TERMINAL_EVENTS


class RunsClient(ApiClient):
    """The public research API: start runs, follow their events, fetch, list and cancel them.

    Use it as an async context manager, which owns the channel::

        async with RunsClient.connect("127.0.0.1:7410") as quarry:
            run = await quarry.start_run("How tall is the Eiffel Tower?")
            async for event in quarry.stream_run(run.run_id):
                ...
    """

    def __init__(self, channel: grpc.aio.Channel, retry: RetryPolicy | None = None) -> None:
        super().__init__(channel, retry)
        self._stub = supervisor_pb2_grpc.SupervisorServiceStub(channel)

    async def start_run(
        self,
        question: str,
        *,
        options: supervisor_pb2.RunOptions | None = None,
        labels: Mapping[str, str] | None = None,
        request_id: str = "",
    ) -> supervisor_pb2.Run:
        """Start a run; retried safely (the request_id makes a repeat return the same run)."""
        request = supervisor_pb2.StartRunRequest(
            question=question, options=options, labels=labels or {}, request_id=request_id or str(uuid.uuid4())
        )
        response: supervisor_pb2.StartRunResponse = await self._retry.call(self._stub.StartRun, request)
        return response.run

    async def get_run(self, run_id: str) -> supervisor_pb2.Run:
        request = supervisor_pb2.GetRunRequest(run_id=run_id)
        response: supervisor_pb2.GetRunResponse = await self._retry.call(self._stub.GetRun, request)
        return response.run

    async def export_run(self, run_id: str) -> AsyncIterator[bytes]:
        """The run's recording, a .qrun file, in pieces to write out in order (see `quarry runs export`)."""
        call = self._stub.ExportRun(supervisor_pb2.ExportRunRequest(run_id=run_id))
        async for response in call:
            yield response.chunk

    async def list_run_ledger(
        self, run_id: str, *, page_size: int = 0, page_token: str = ""
    ) -> supervisor_pb2.ListRunLedgerResponse:
        """One page of the run's research ledger (its scratchpad thread's entries, in order)."""
        request = supervisor_pb2.ListRunLedgerRequest(run_id=run_id, page_size=page_size, page_token=page_token)
        response: supervisor_pb2.ListRunLedgerResponse = await self._retry.call(self._stub.ListRunLedger, request)
        return response

    async def read_ledger(self, run_id: str, *, max_pages: int = 1000) -> list[scratchpad_pb2.Entry]:
        """The run's whole research ledger, page by page (at most `max_pages` of 1000 entries)."""
        entries: list[scratchpad_pb2.Entry] = []
        token = ""
        for _ in range(max_pages):
            response = await self.list_run_ledger(run_id, page_size=1000, page_token=token)
            entries.extend(response.entries)
            token = response.next_page_token
            if not token:
                return entries
        raise RuntimeError(f"run {run_id}'s ledger is longer than {max_pages} pages")

    async def list_runs(
        self,
        *,
        page_size: int = 0,
        page_token: str = "",
        state: supervisor_pb2.RunState.ValueType = supervisor_pb2.RUN_STATE_UNSPECIFIED,
    ) -> supervisor_pb2.ListRunsResponse:
        request = supervisor_pb2.ListRunsRequest(page_size=page_size, page_token=page_token, state=state)
        response: supervisor_pb2.ListRunsResponse = await self._retry.call(self._stub.ListRuns, request)
        return response

    async def cancel_run(self, run_id: str, reason: str = "") -> supervisor_pb2.Run:
        request = supervisor_pb2.CancelRunRequest(run_id=run_id, reason=reason)
        response: supervisor_pb2.CancelRunResponse = await self._retry.call(
            self._stub.CancelRun, request, extra_timeout=15
        )
        return response.run

    async def approve_run(self, run_id: str, comment: str = "", *, over_objections: bool = False) -> supervisor_pb2.Run:
        """Approve a run awaiting approval: it completes with its report (a repeat returns it). A run whose review
        left objections open needs `over_objections` and a comment giving the reason."""
        request = supervisor_pb2.ApproveRunRequest(run_id=run_id, comment=comment, over_objections=over_objections)
        response: supervisor_pb2.ApproveRunResponse = await self._retry.call(
            self._stub.ApproveRun, request, extra_timeout=15
        )
        return response.run

    async def reject_run(self, run_id: str, reason: str = "") -> supervisor_pb2.Run:
        """Reject a run awaiting approval: it fails with RUN_ERROR_CODE_REJECTED and the reason."""
        request = supervisor_pb2.RejectRunRequest(run_id=run_id, reason=reason)
        response: supervisor_pb2.RejectRunResponse = await self._retry.call(
            self._stub.RejectRun, request, extra_timeout=15
        )
        return response.run

    async def stream_run(
        self, run_id: str, *, after_sequence_no: int = 0, max_reconnects: int = 100
    ) -> AsyncIterator[supervisor_pb2.RunEvent]:
        """The run's events in order until its terminal event, re-attaching after UNAVAILABLE from the
        last one received: nothing is missed and nothing comes twice."""

        async def open_after(after: int) -> AsyncIterator[supervisor_pb2.RunEvent]:
            call = self._stub.StreamRun(supervisor_pb2.StreamRunRequest(run_id=run_id, after_sequence_no=after))
            return (response.event async for response in call)

        events = resumable_stream(
            open_after,
            attrgetter("sequence_no"),
            after=after_sequence_no,
            # Waits, with backoff, until the service answers again.
            wait_until_back=lambda: self.get_run(run_id),
            policy=ResumePolicy(max_reconnects=max_reconnects),
            done=is_terminal,
        )
        async for event in events:
            yield event
