"""When a delegation may go to another worker: only when refused before any event, never once `started`.

Unit-level: two fake workers served in this process, no worker, scratchpad or model behind them, so the
rule is pinned in milliseconds; test_seed_contract.py kills a real worker mid-delegation over processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from quarry.identity import Role
from quarry.server import ServiceHost, ServiceRegistration
from quarry.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from quarry.vocabulary import DelegationErrorCode, DelegationResult, Tier
from supervisor_svc.runs.domain import DelegationOrder
from supervisor_svc.runs.worker_client import DelegationClient
from worker_svc.service import SERVICE_NAME


@dataclass
class FakeWorker(worker_pb2_grpc.WorkerServiceServicer):
    """A worker that records what it was sent, and fails with `code` before or after `started`, or answers."""

    worker_id: str
    code: grpc.StatusCode | None = None
    after_started: bool = True
    received: list[str] = field(default_factory=list)

    async def Delegate(self, request: worker_pb2.DelegateRequest, context: Any) -> AsyncIterator[Any]:
        self.received.append(request.delegation_id)
        if self.code is not None and not self.after_started:
            await context.abort(self.code, "refused before starting")
        started = worker_pb2.DelegationStarted(
            delegation_id=request.delegation_id, worker_id=self.worker_id, tier=common_pb2.MODEL_TIER_WORKER, model="m"
        )
        yield worker_pb2.DelegateResponse(started=started)
        if self.code is not None:
            await context.abort(self.code, "the worker went away mid-delegation")
        result = worker_pb2.DelegationResult(
            delegation_id=request.delegation_id,
            tool_call_id=request.tool_call_id,
            outcome=common_pb2.DELEGATION_OUTCOME_SUCCEEDED,
            summary=f"done by {self.worker_id}",
        )
        yield worker_pb2.DelegateResponse(result=result)


def serve(worker: FakeWorker) -> ServiceHost:
    registration = ServiceRegistration(
        SERVICE_NAME, lambda server: worker_pb2_grpc.add_WorkerServiceServicer_to_server(worker, server)
    )
    return ServiceHost("127.0.0.1:0", [registration], grace=1)


ORDER = DelegationOrder(
    delegation_id="run-1.1.c1",
    run_id="run-1",
    tool_call_id="c1",
    scratchpad_thread_id="thread-1",
    objective="Report.",
    criteria=(),
    input_refs=(),
    role=Role.RESEARCHER,
    max_turns=0,
    max_tokens=0,
    timeout_seconds=10,
)


@dataclass
class Delegated:
    result: DelegationResult
    started: list[tuple[str, Tier | None, str]]


async def delegate(first: FakeWorker, second: FakeWorker) -> Delegated:
    """One delegation through a client whose round robin tries `first`, then `second`."""
    started: list[tuple[str, Tier | None, str]] = []

    async def on_started(worker_id: str, tier: Tier | None, model: str) -> None:
        started.append((worker_id, tier, model))

    async def on_turn(turn: int, max_turns: int, worker_id: str) -> None:
        pass

    async with serve(first) as one, serve(second) as two:
        client = DelegationClient([one.address, two.address], reconnect_wait=0.1)
        try:
            result = await client.run(ORDER, deadline_seconds=10, on_turn=on_turn, on_started=on_started)
        finally:
            await client.close()
    return Delegated(result, started)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
async def test_a_worker_that_fails_after_started_is_not_replaced_by_another(code: grpc.StatusCode) -> None:
    """Once a worker said `started` it may have searched, written to the scratchpad and spent tokens: the
    delegation fails as WORKER_UNAVAILABLE, naming that worker, and is never silently re-sent (the
    second worker would run it again), even for the codes that are retried before any event."""
    dying, spare = FakeWorker("worker-a", code), FakeWorker("worker-b")
    delegated = await delegate(dying, spare)
    assert dying.received == [ORDER.delegation_id]
    assert spare.received == [], "the delegation was re-sent after the first worker had started it"
    assert delegated.started == [("worker-a", Tier.WORKER, "m")]
    result = delegated.result
    assert (result.delegation_id, result.error_code) == (ORDER.delegation_id, DelegationErrorCode.WORKER_UNAVAILABLE)
    assert result.worker_id == "worker-a" and "went away mid-delegation" in result.error_message


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
async def test_a_worker_that_refuses_before_any_event_is_replaced_once(code: grpc.StatusCode) -> None:
    """The other side of the rule: nothing ran yet, so the next worker takes it, with the same delegation_id."""
    busy, spare = FakeWorker("worker-a", code, after_started=False), FakeWorker("worker-b")
    delegated = await delegate(busy, spare)
    assert busy.received == spare.received == [ORDER.delegation_id]
    assert delegated.result.succeeded and delegated.result.summary == "done by worker-b"
    assert delegated.started == [("worker-b", Tier.WORKER, "m")]


async def test_a_worker_that_fails_after_started_with_another_code_is_not_replaced_either() -> None:
    dying, spare = FakeWorker("worker-a", grpc.StatusCode.INTERNAL), FakeWorker("worker-b")
    delegated = await delegate(dying, spare)
    assert spare.received == []
    assert delegated.result.error_code is DelegationErrorCode.WORKER_UNAVAILABLE
