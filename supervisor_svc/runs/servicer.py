"""SupervisorService over gRPC: translates quarry.v1 messages to Supervisor calls and back."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import json_format

from quarry.convert import (
    ROLES,
    TIERS,
    EnumMap,
    duration,
    duration_seconds,
    entry_to_proto,
    timestamp,
    verification_to_proto,
)
from quarry.identity import Role
from quarry.replay import qrun
from quarry.v1 import supervisor_pb2, supervisor_pb2_grpc
from quarry.vocabulary import Tier
from supervisor_svc.runs.domain import VERIFICATION_OFF, VERIFICATION_ON, RunOptions, RunRecord, RunState, StartRequest
from supervisor_svc.runs.events import (
    error_to_proto,
    report_to_proto,
    run_usage_to_proto,
    warnings_to_proto,
)
from supervisor_svc.runs.service import Supervisor

_STATES: EnumMap[RunState, supervisor_pb2.RunState.ValueType] = EnumMap(
    {
        RunState.QUEUED: supervisor_pb2.RUN_STATE_QUEUED,
        RunState.RUNNING: supervisor_pb2.RUN_STATE_RUNNING,
        RunState.SUCCEEDED: supervisor_pb2.RUN_STATE_SUCCEEDED,
        RunState.FAILED: supervisor_pb2.RUN_STATE_FAILED,
        RunState.CANCELLED: supervisor_pb2.RUN_STATE_CANCELLED,
        RunState.AWAITING_APPROVAL: supervisor_pb2.RUN_STATE_AWAITING_APPROVAL,
    }
)
_VERIFICATION_MODES = {
    supervisor_pb2.VERIFICATION_MODE_UNSPECIFIED: "",
    supervisor_pb2.VERIFICATION_MODE_ON: VERIFICATION_ON,
    supervisor_pb2.VERIFICATION_MODE_OFF: VERIFICATION_OFF,
}
_VERIFICATION_NUMBERS = {mode: number for number, mode in _VERIFICATION_MODES.items()}


def options_from_proto(options: supervisor_pb2.RunOptions) -> RunOptions:
    return RunOptions(
        max_supervisor_turns=options.max_supervisor_turns,
        max_worker_turns=options.max_worker_turns,
        max_parallel_delegations=options.max_parallel_delegations,
        timeout_seconds=duration_seconds(options.timeout) if options.HasField("timeout") else 0.0,
        max_tokens=options.max_tokens,
        # A mode this build does not know stays unknown, for validation to name.
        verification=_VERIFICATION_MODES.get(options.verification, f"unknown:{options.verification}"),
        require_approval=options.require_approval,
        max_revision_rounds=options.max_revision_rounds,
        # A role or tier this build does not know (or none) stays unknown, for validation to name.
        role_tiers=tuple(
            (_known(ROLES.from_proto(route.role), route.role), _known(TIERS.from_proto(route.tier), route.tier))
            for route in options.role_routes
        ),
    )


def _known(member: enum.Enum | None, number: int) -> str:
    return str(member.value) if member is not None else f"unknown:{number}"


def options_to_proto(options: RunOptions) -> supervisor_pb2.RunOptions:
    message = supervisor_pb2.RunOptions(
        max_supervisor_turns=options.max_supervisor_turns,
        max_worker_turns=options.max_worker_turns,
        max_parallel_delegations=options.max_parallel_delegations,
        max_tokens=options.max_tokens,
        verification=_VERIFICATION_NUMBERS[options.verification],
        require_approval=options.require_approval,
        max_revision_rounds=options.max_revision_rounds,
        role_routes=[
            supervisor_pb2.RoleRoute(role=ROLES.to_proto(Role(role)), tier=TIERS.to_proto(Tier(tier)))
            for role, tier in options.role_tiers
        ],
    )
    if options.timeout_seconds:
        message.timeout.CopyFrom(duration(options.timeout_seconds))
    return message


def _approval(record: RunRecord) -> dict[str, str] | None:
    """The decision a run awaiting approval got, which a replay takes again."""
    approval = record.approval
    return None if approval is None else {"decision": approval.decision.value, "note": approval.note}


def run_to_proto(record: RunRecord) -> supervisor_pb2.Run:
    run = supervisor_pb2.Run(
        run_id=record.run_id,
        question=record.question,
        state=_STATES.to_proto(record.state),
        options=options_to_proto(record.options),
        scratchpad_thread_id=record.scratchpad_thread_id,
        usage=run_usage_to_proto(record.usage),
        last_sequence_no=record.last_sequence_no,
        labels=record.labels,
        create_time=timestamp(record.create_time),
        warnings=warnings_to_proto(record.warnings),
        created_by=record.created_by,
        decided_by=record.approval.decided_by if record.approval else "",
    )
    if record.report is not None:
        run.report.CopyFrom(report_to_proto(record.report))
    if record.verification is not None:
        run.verification.CopyFrom(verification_to_proto(record.verification))
    run.cancel_reason = record.cancel_reason
    if record.error_code is not None:
        run.error.CopyFrom(error_to_proto(record.error_code, record.last_error))
    if record.start_time is not None:
        run.start_time.CopyFrom(timestamp(record.start_time))
    if record.end_time is not None:
        run.end_time.CopyFrom(timestamp(record.end_time))
    return run


class SupervisorServicer(supervisor_pb2_grpc.SupervisorServiceServicer):
    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    async def StartRun(
        self, request: supervisor_pb2.StartRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> supervisor_pb2.StartRunResponse:
        record = await self._supervisor.start_run(
            StartRequest(
                question=request.question,
                options=options_from_proto(request.options),
                labels=dict(request.labels),
                request_id=request.request_id,
            )
        )
        return supervisor_pb2.StartRunResponse(run=run_to_proto(record))

    async def StreamRun(
        self, request: supervisor_pb2.StreamRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[supervisor_pb2.StreamRunResponse]:
        stream = await self._supervisor.events(request.run_id, request.after_sequence_no)
        await context.send_initial_metadata(())  # the stream is live: a client may now rely on it
        async for stored in stream:
            yield supervisor_pb2.StreamRunResponse(event=supervisor_pb2.RunEvent.FromString(stored.payload))

    async def ExportRun(
        self, request: supervisor_pb2.ExportRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[supervisor_pb2.ExportRunResponse]:
        export = await self._supervisor.export(request.run_id)
        opening = [
            qrun.header_line(export.record.run_id, export.settings),
            qrun.line(
                "run",
                run=json_format.MessageToDict(run_to_proto(export.record)),
                approval=_approval(export.record),
            ),
            *(
                qrun.line("event", event=json_format.MessageToDict(supervisor_pb2.RunEvent.FromString(stored.payload)))
                for stored in export.events
            ),
        ]
        for piece in qrun.chunked(opening):
            yield supervisor_pb2.ExportRunResponse(chunk=piece)
        async for piece in qrun.chunked_async(export.recording):
            yield supervisor_pb2.ExportRunResponse(chunk=piece)

    async def GetRun(
        self, request: supervisor_pb2.GetRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> supervisor_pb2.GetRunResponse:
        return supervisor_pb2.GetRunResponse(run=run_to_proto(await self._supervisor.get(request.run_id)))

    async def ListRunLedger(
        self, request: supervisor_pb2.ListRunLedgerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> supervisor_pb2.ListRunLedgerResponse:
        entries, token = await self._supervisor.ledger(request.run_id, request.page_size, request.page_token)
        return supervisor_pb2.ListRunLedgerResponse(entries=[entry_to_proto(e) for e in entries], next_page_token=token)

    async def ListRuns(
        self, request: supervisor_pb2.ListRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> supervisor_pb2.ListRunsResponse:
        state = _STATES.requested(request.state, field="state", enum_name="RunState")
        records, token = await self._supervisor.list_runs(request.page_size, request.page_token, state)
        return supervisor_pb2.ListRunsResponse(runs=[run_to_proto(r) for r in records], next_page_token=token)

    async def CancelRun(
        self, request: supervisor_pb2.CancelRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> supervisor_pb2.CancelRunResponse:
        record = await self._supervisor.cancel(request.run_id, request.reason)
        return supervisor_pb2.CancelRunResponse(run=run_to_proto(record))

    async def ApproveRun(
        self, request: supervisor_pb2.ApproveRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> supervisor_pb2.ApproveRunResponse:
        record = await self._supervisor.approve(
            request.run_id, request.comment, over_objections=request.over_objections
        )
        return supervisor_pb2.ApproveRunResponse(run=run_to_proto(record))

    async def RejectRun(
        self, request: supervisor_pb2.RejectRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> supervisor_pb2.RejectRunResponse:
        record = await self._supervisor.reject(request.run_id, request.reason)
        return supervisor_pb2.RejectRunResponse(run=run_to_proto(record))
