"""The supervisor's side of delegation: every Delegate call ends in exactly one correlated result.

Whatever happens to the worker — unreachable, overloaded, a broken stream, a
deadline, or a stream that ends without its result — the tool call that asked
for the delegation gets one DelegationResult carrying its delegation_id: the
worker's own, or an error made here. Workers are addressed as a list of
targets used round-robin; a delegation refused as UNAVAILABLE or
RESOURCE_EXHAUSTED before any event is tried once more on the next worker with
the same delegation_id (the worker de-duplicates by it). A worker that served
before and cannot be reached now is most likely restarting (`quarry up`
restarts a dead one on its address): the second attempt gives it a few
seconds to come back before the delegation counts it as unavailable. A
worker that goes away mid-stream leaves its delegation to another worker over
the same database, which goes on with it from its recorded conversation once
the dead one's lease lapses; so does a run taken up by another supervisor,
which first asks the workers (GetDelegation) which one has the delegation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import itertools
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from quarry.clients.channels import Dialer
from quarry.convert import ROLES, TIERS, delegation_result_from_proto, duration
from quarry.errors import Unavailable
from quarry.replay.qrun import lines_of
from quarry.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from quarry.vocabulary import DelegationResult, Tier
from supervisor_svc.runs.domain import DelegationOrder

log = logging.getLogger(__name__)

# How long a delegation waits for a worker that served before to be reachable again.
RECONNECT_WAIT_SECONDS = 10.0
# How long a delegation ordered again (its run was taken up by another process) keeps asking the worker
# that has it while that worker answers UNAVAILABLE: it is restarting, or the delegation still runs for a
# caller that went away, or under the lease of a worker that died (30 s by default).
RESUME_WAIT_SECONDS = 60.0
# How long finding the worker that has a delegation may take, each worker asked at once.
_LOCATE_SECONDS = 3.0
# How long a worker may take to give its recording of one run.
_EXPORT_SECONDS = 120.0

EventListener = Callable[[worker_pb2.DelegateResponse], Awaitable[None] | None]
# Told each worker turn as it starts: (turn, max_turns, the id of the worker running it).
TurnListener = Callable[[int, int, str], Awaitable[None]]
# Told once a worker has taken the delegation: (its id, the tier it runs on, that tier's model).
StartListener = Callable[[str, Tier | None, str], Awaitable[None]]

# Refusals that happen before a worker starts anything: another worker may take the delegation.
_TRY_ELSEWHERE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
_ERROR_CODES = {
    grpc.StatusCode.UNAVAILABLE: common_pb2.DELEGATION_ERROR_CODE_WORKER_UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED: common_pb2.DELEGATION_ERROR_CODE_WORKER_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: common_pb2.DELEGATION_ERROR_CODE_DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED: common_pb2.DELEGATION_ERROR_CODE_CANCELLED,
    grpc.StatusCode.INVALID_ARGUMENT: common_pb2.DELEGATION_ERROR_CODE_INVALID_TASK,
    grpc.StatusCode.FAILED_PRECONDITION: common_pb2.DELEGATION_ERROR_CODE_INVALID_TASK,
}


def failed(
    request: worker_pb2.DelegateRequest, code: common_pb2.DelegationErrorCode.ValueType, message: str
) -> worker_pb2.DelegationResult:
    return worker_pb2.DelegationResult(
        delegation_id=request.delegation_id,
        tool_call_id=request.tool_call_id,
        outcome=common_pb2.DELEGATION_OUTCOME_FAILED,
        error=common_pb2.DelegationError(code=code, message=message),
    )


def request_for(order: DelegationOrder) -> worker_pb2.DelegateRequest:
    return worker_pb2.DelegateRequest(
        delegation_id=order.delegation_id,
        run_id=order.run_id,
        tool_call_id=order.tool_call_id,
        scratchpad_thread_id=order.scratchpad_thread_id,
        task=worker_pb2.ResearchTask(
            objective=order.objective,
            criteria=order.criteria,
            input_refs=order.input_refs,
            workspace_id=order.workspace_id,
        ),
        role=ROLES.to_proto(order.role),
        tier=TIERS.to_proto(order.tier) if order.tier is not None else common_pb2.MODEL_TIER_UNSPECIFIED,
        budget=worker_pb2.DelegationBudget(
            max_turns=order.max_turns,
            max_tokens=order.max_tokens,
            timeout=duration(max(int(order.timeout_seconds), 1)),
        ),
    )


async def _notify(listener: EventListener, response: worker_pb2.DelegateResponse) -> None:
    """Progress is for watching: a listener that fails must not cost the delegation its result."""
    try:
        handled = listener(response)
        if inspect.isawaitable(handled):
            await handled
    except Exception:
        log.exception("a delegation event listener failed")


class DelegationClient:
    def __init__(
        self, targets: Sequence[str], dial: Dialer | None = None, *, reconnect_wait: float = RECONNECT_WAIT_SECONDS
    ) -> None:
        if not targets:
            raise ValueError("at least one worker target is needed")
        self._targets = list(targets)
        # A target may be one DNS name for many workers (a headless Service): its channel balances over them.
        self._channels = [(dial or Dialer()).channel(target) for target in self._targets]
        self._stubs = [worker_pb2_grpc.WorkerServiceStub(channel) for channel in self._channels]
        self._turn = itertools.cycle(range(len(self._stubs)))
        self._reconnect_wait = reconnect_wait
        self._served: set[int] = set()  # targets that have answered a delegation

    async def recordings(self, run_id: str) -> AsyncIterator[bytes]:
        """What each worker target recorded for the run's delegations, as .qrun lines. A target that does not
        answer fails the export (UNAVAILABLE): a recording without its exchanges would not replay."""
        for target, stub in zip(self._targets, self._stubs, strict=True):
            try:
                pieces = stub.ExportRecording(worker_pb2.ExportRecordingRequest(run_id=run_id), timeout=_EXPORT_SECONDS)
                async for text in lines_of(response.chunk async for response in pieces):
                    yield text
            except grpc.aio.AioRpcError as error:
                raise Unavailable(
                    f"worker {target} did not give its recording of run {run_id} "
                    f"({error.code().name}: {error.details()}); export again once it answers"
                ) from error

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close(None)

    async def run(
        self,
        order: DelegationOrder,
        *,
        deadline_seconds: float,
        on_turn: TurnListener,
        on_started: StartListener | None = None,
    ) -> DelegationResult:
        """`delegate` in the supervisor's own terms."""
        worker_id = ""

        async def progress(response: worker_pb2.DelegateResponse) -> None:
            nonlocal worker_id
            event, progress = response.WhichOneof("event"), response.progress
            if event == "started":
                started = response.started
                worker_id = started.worker_id
                if on_started is not None:
                    await on_started(worker_id, TIERS.from_proto(started.tier), started.model)
            elif event == "progress" and progress.kind == worker_pb2.PROGRESS_KIND_TURN_STARTED:
                await on_turn(progress.turn, progress.max_turns, worker_id)

        request = request_for(order)
        holder = await self._locate(order.delegation_id) if order.resumed else None
        if holder is None:
            reply = await self.delegate(request, deadline_seconds=deadline_seconds, on_event=progress)
        else:
            reply = await self._resume_on(holder, request, deadline_seconds, progress)
        result = delegation_result_from_proto(reply)
        # A failure made here (the worker died mid-stream) still names the worker that had taken it.
        return result if result.worker_id else dataclasses.replace(result, worker_id=worker_id)

    async def delegate(
        self,
        request: worker_pb2.DelegateRequest,
        *,
        deadline_seconds: float | None = None,
        on_event: EventListener | None = None,
    ) -> worker_pb2.DelegationResult:
        """Run one delegation on some worker; never raises except when the caller is cancelled."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        for attempt in (1, 2):
            index = next(self._turn)
            # The last chance: a worker that is coming back is worth waiting for (the first attempt fails over).
            waited = await self._reconnected(index, deadline_seconds) if attempt == 2 else 0.0
            remaining = None if deadline_seconds is None else max(deadline_seconds - waited, 0.001)
            outcome = await self._attempt(self._stubs[index], request, remaining, on_event)
            if isinstance(outcome, worker_pb2.DelegationResult) or outcome[1]:
                self._served.add(index)
            if isinstance(outcome, worker_pb2.DelegationResult):
                return outcome
            error, events_seen = outcome
            holder = await self._other_holder(index, request, error) if events_seen else None
            if holder is not None:
                # The worker went away mid-delegation, and another over the same database has its record: that
                # one goes on with it from its recorded conversation, once the dead one's lease lapses. A worker
                # without the record would run it again from scratch: that never happens silently.
                log.warning(
                    "worker %s went away during %s (%s); %s goes on with it",
                    self._targets[index],
                    request.delegation_id,
                    error.details(),
                    self._targets[holder],
                )
                left = None if deadline_seconds is None else deadline_seconds - (loop.time() - started)
                return await self._resume_on(holder, request, left, on_event)
            if attempt == 1 and not events_seen and error.code() in _TRY_ELSEWHERE:
                log.warning(
                    "worker %s refused %s (%s); trying another",
                    self._targets[index],
                    request.delegation_id,
                    error.code().name,
                )
                continue
            code = _ERROR_CODES.get(error.code(), common_pb2.DELEGATION_ERROR_CODE_WORKER_UNAVAILABLE)
            return failed(request, code, f"worker {self._targets[index]}: {error.code().name}: {error.details()}")
        raise AssertionError("unreachable: the second attempt always returns")

    async def _other_holder(
        self, index: int, request: worker_pb2.DelegateRequest, error: grpc.aio.AioRpcError
    ) -> int | None:
        """After target `index` went away mid-stream: another target that has the delegation's record (the same
        one when it is the only target: one name for many workers, which its channel balances over)."""
        if error.code() != grpc.StatusCode.UNAVAILABLE:
            return None
        return await self._locate(request.delegation_id, skip=index if len(self._stubs) > 1 else None)

    async def _locate(self, delegation_id: str, *, skip: int | None = None) -> int | None:
        """The target whose worker has a record of the delegation (GetDelegation on each at once), if any."""

        async def has(index: int) -> bool:
            stub = self._stubs[index]
            try:
                await stub.GetDelegation(
                    worker_pb2.GetDelegationRequest(delegation_id=delegation_id), timeout=_LOCATE_SECONDS
                )
            except grpc.aio.AioRpcError:
                return False
            return True

        indexes = [index for index in range(len(self._stubs)) if index != skip]
        found = await asyncio.gather(*(has(index) for index in indexes))
        return next((index for index, yes in zip(indexes, found, strict=True) if yes), None)

    async def _resume_on(
        self,
        index: int,
        request: worker_pb2.DelegateRequest,
        deadline_seconds: float | None,
        on_event: EventListener | None,
    ) -> worker_pb2.DelegationResult:
        """The same delegation again, on the worker that has its record: it replays the result or goes on with
        the recorded conversation. UNAVAILABLE (restarting, still running, leased to a worker that died) is
        waited out, within RESUME_WAIT_SECONDS and the deadline."""
        loop = asyncio.get_running_loop()
        until = loop.time() + min(deadline_seconds or math.inf, RESUME_WAIT_SECONDS)
        delay = 0.5
        while True:
            remaining = None if deadline_seconds is None else max(until - loop.time(), 0.001)
            outcome = await self._attempt(self._stubs[index], request, remaining, on_event)
            if isinstance(outcome, worker_pb2.DelegationResult):
                self._served.add(index)
                return outcome
            error, events_seen = outcome
            if error.code() != grpc.StatusCode.UNAVAILABLE or events_seen or loop.time() + delay > until:
                code = _ERROR_CODES.get(error.code(), common_pb2.DELEGATION_ERROR_CODE_WORKER_UNAVAILABLE)
                return failed(request, code, f"worker {self._targets[index]}: {error.code().name}: {error.details()}")
            log.info("worker %s: %s (%s); asking again", self._targets[index], request.delegation_id, error.details())
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _reconnected(self, index: int, deadline_seconds: float | None) -> float:
        """Wait, within bounds, for a worker that served before to be reachable again; the seconds waited."""
        channel = self._channels[index]
        if index not in self._served or channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            return 0.0
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(channel.channel_ready(), min(self._reconnect_wait, deadline_seconds or math.inf))
        return loop.time() - started

    async def _attempt(
        self,
        stub: worker_pb2_grpc.WorkerServiceStub,
        request: worker_pb2.DelegateRequest,
        deadline_seconds: float | None,
        on_event: EventListener | None,
    ) -> worker_pb2.DelegationResult | tuple[grpc.aio.AioRpcError, bool]:
        events_seen = ended = False
        # The generated stub is typed for sync grpc; on an aio channel the call is an async iterator.
        stream: Any = stub.Delegate(request, timeout=deadline_seconds)
        try:
            async for response in stream:
                events_seen = True
                if response.WhichOneof("event") == "result":
                    ended = True  # the worker's stream ends itself after its result
                    if response.result.delegation_id != request.delegation_id:
                        return failed(
                            request,
                            common_pb2.DELEGATION_ERROR_CODE_PROTOCOL_VIOLATION,
                            f"the worker answered for delegation {response.result.delegation_id!r}",
                        )
                    result: worker_pb2.DelegationResult = response.result
                    return result
                if on_event is not None:
                    await _notify(on_event, response)
        except grpc.aio.AioRpcError as error:
            return error, events_seen
        finally:
            if not ended:
                stream.cancel()  # we stop listening: the worker stops too
        return failed(
            request, common_pb2.DELEGATION_ERROR_CODE_PROTOCOL_VIOLATION, "the worker's stream ended without a result"
        )
