"""WorkerService over gRPC: translates quarry.v1 messages to Worker calls and back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from quarry.convert import (
    ROLES,
    TIERS,
    EnumMap,
    delegation_result_to_proto,
    duration_seconds,
    timestamp,
)
from quarry.errors import NotFound
from quarry.replay import qrun
from quarry.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from quarry.vocabulary import Tier
from worker_svc.delegations import DelegationRequest, DelegationState, Event, Progress, Started
from worker_svc.worker import Worker

STATES: EnumMap[DelegationState, worker_pb2.DelegationState.ValueType] = EnumMap(
    {
        DelegationState.RUNNING: worker_pb2.DELEGATION_STATE_RUNNING,
        DelegationState.SUCCEEDED: worker_pb2.DELEGATION_STATE_SUCCEEDED,
        DelegationState.FAILED: worker_pb2.DELEGATION_STATE_FAILED,
    }
)
_PROGRESS_KINDS: dict[str, worker_pb2.ProgressKind.ValueType] = {
    "turn": worker_pb2.PROGRESS_KIND_TURN_STARTED,
    "tool": worker_pb2.PROGRESS_KIND_TOOL_CALLED,
    "appended": worker_pb2.PROGRESS_KIND_SCRATCHPAD_APPENDED,
}


def request_from_proto(request: worker_pb2.DelegateRequest) -> DelegationRequest:
    budget = request.budget
    return DelegationRequest(
        delegation_id=request.delegation_id,
        run_id=request.run_id,
        tool_call_id=request.tool_call_id,
        scratchpad_thread_id=request.scratchpad_thread_id,
        objective=request.task.objective,
        criteria=tuple(request.task.criteria),
        input_refs=tuple(request.task.input_refs),
        role=ROLES.from_proto(request.role),
        max_turns=budget.max_turns,
        timeout_seconds=duration_seconds(budget.timeout) if budget.HasField("timeout") else 0.0,
        max_tokens=budget.max_tokens,
        workspace_id=request.task.workspace_id,
        question=request.task.question,
        tier=TIERS.requested(request.tier, field="tier", enum_name="ModelTier"),
    )


def _tier(tier: Tier | None) -> common_pb2.ModelTier.ValueType:
    return common_pb2.MODEL_TIER_UNSPECIFIED if tier is None else TIERS.to_proto(tier)


def event_to_proto(event: Event) -> worker_pb2.DelegateResponse:
    if isinstance(event, Started):
        return worker_pb2.DelegateResponse(
            started=worker_pb2.DelegationStarted(
                delegation_id=event.delegation_id,
                conversation_id=event.conversation_id,
                worker_id=event.worker_id,
                tier=_tier(event.tier),
                model=event.model,
            )
        )
    if isinstance(event, Progress):
        return worker_pb2.DelegateResponse(
            progress=worker_pb2.DelegationProgress(
                delegation_id=event.delegation_id,
                turn=event.turn,
                max_turns=event.max_turns,
                kind=_PROGRESS_KINDS[event.kind],
                summary=event.summary,
                tool_name=event.tool_name,
                scratchpad_sequence_no=event.sequence_no,
            )
        )
    return worker_pb2.DelegateResponse(result=delegation_result_to_proto(event))


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    async def Delegate(
        self, request: worker_pb2.DelegateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[worker_pb2.DelegateResponse]:
        events = await self._worker.delegate(request_from_proto(request))
        async for event in events:
            yield event_to_proto(event)

    async def ExportRecording(
        self, request: worker_pb2.ExportRecordingRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[worker_pb2.ExportRecordingResponse]:
        async for piece in qrun.chunked_async(self._worker.recording_lines(request.run_id)):
            yield worker_pb2.ExportRecordingResponse(chunk=piece)

    async def GetDelegation(
        self, request: worker_pb2.GetDelegationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.GetDelegationResponse:
        record = await self._worker.get(request.delegation_id)
        if record is None:
            raise NotFound("delegation", request.delegation_id, field="delegation_id")
        delegation = worker_pb2.Delegation(
            delegation_id=record.delegation_id,
            run_id=record.run_id,
            conversation_id=record.conversation_id,
            scratchpad_thread_id=record.scratchpad_thread_id,
            role=ROLES.to_proto(record.role),
            task=worker_pb2.ResearchTask(
                objective=record.objective,
                criteria=list(record.criteria),
                input_refs=list(record.input_refs),
                workspace_id=record.workspace_id,
                question=record.question,
            ),
            tier=_tier(record.tier),
            state=STATES.to_proto(record.state),
            create_time=timestamp(record.create_time),
            last_error=record.last_error,
            tool_call_id=record.tool_call_id,
            worker_id=record.worker_id,
        )
        if record.outcome is not None:
            delegation.result.CopyFrom(delegation_result_to_proto(record.outcome))
        if record.end_time is not None:
            delegation.end_time.CopyFrom(timestamp(record.end_time))
        return worker_pb2.GetDelegationResponse(delegation=delegation)
