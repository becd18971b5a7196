"""Runs delegations: one bounded agent run per Delegate call, always ending in one DelegationResult.

The worker admits a checked request (worker_svc.validation) within its concurrency bound, streams
its events, and hands the run itself to worker_svc.execution. The outcome is recorded before it is
sent, so a repeated Delegate with the same delegation_id returns it without running again. The
leases of running delegations are renewed, and those of workers that died are ended as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from quarry import ids
from quarry.agent.conversation import ConversationStore
from quarry.agent.messages import Message, system, user
from quarry.agent.model import ModelClient
from quarry.errors import ErrorReason, FailedPrecondition, ResourceExhausted, Unavailable
from quarry.lease import LeaseKeeper, LeaseTerms
from quarry.recording import Recordings
from quarry.replay import qrun
from quarry.vocabulary import DelegationErrorCode, DelegationResult, Tier
from worker_svc.delegations import DelegationRecord, DelegationRequest, Event, Started
from worker_svc.execution import DelegationRunner, task_message, tier_of
from worker_svc.roles import ROLES
from worker_svc.store import DelegationStore
from worker_svc.tools import DelegationContext
from worker_svc.validation import check_same_request, validate

log = logging.getLogger(__name__)

# How long a Delegate for a delegation still running here waits for it to stop (its earlier caller went
# away, so it is being cancelled) before it is refused as running.
_INTERRUPTION_WAIT_SECONDS = 10.0


@dataclass(frozen=True)
class WorkerLimits:
    max_concurrent: int = 64
    default_timeout_seconds: float = 600.0
    context_tokens: int = 96_000
    # Whether a monitor is configured, so that roles get the capabilities that ask it (an engineer needs it).
    compute: bool = False
    # A running delegation whose worker has not renewed its lease for this long is ended as failed.
    lease_seconds: float = 30.0


class Worker:
    def __init__(
        self,
        *,
        models: Mapping[Tier, ModelClient],
        conversations: ConversationStore,
        delegations: DelegationStore,
        context_for: Callable[[DelegationRequest], DelegationContext],
        limits: WorkerLimits,
        recordings: Recordings | None = None,
    ) -> None:
        self._models = models
        self._recordings = recordings
        self._delegations = delegations
        self._limits = limits
        self._runner = DelegationRunner(
            models=models,
            conversations=conversations,
            delegations=delegations,
            context_for=context_for,
            default_timeout_seconds=limits.default_timeout_seconds,
            context_tokens=limits.context_tokens,
            compute=limits.compute,
            recordings=recordings,
        )
        self._running: dict[str, asyncio.Task[DelegationResult]] = {}
        # Delegations being admitted: counted with those running, each once (an admitted one is in both until
        # its admission returns, a loop iteration after its task was registered).
        self._admitting: set[str] = set()
        self._leases = LeaseKeeper(
            "delegation",
            delegations.owner,
            delegations,
            held=lambda: self._running.keys(),
            take_over=delegations.end_as_failed,
            terms=LeaseTerms(lease_seconds=limits.lease_seconds, max_interval_seconds=5.0),
        )
        self._admitted = asyncio.Event()  # set while no admission is under way
        self._admitted.set()
        self._closing = False

    async def start(self) -> None:
        """Begin renewing the leases of running delegations and ending those of workers that died."""
        self._leases.start()

    async def get(self, delegation_id: str) -> DelegationRecord | None:
        ids.DELEGATION_ID.require("delegation_id", delegation_id)
        return await self._delegations.get(delegation_id)

    async def recording_lines(self, run_id: str) -> AsyncIterator[bytes]:
        """What this worker recorded for a run's delegations, as .qrun lines: its settings, then the exchanges
        and their bodies."""
        ids.RUN_REFERENCE.require("run_id", run_id)
        if self._recordings is None:
            return
        yield qrun.line("worker", settings=dict(self._recordings.settings))
        exchanges, bodies = await self._recordings.store.read(run_id)
        for text in qrun.recording_lines(exchanges, bodies):
            yield text

    async def delegate(self, request: DelegationRequest) -> AsyncIterator[Event]:
        """Check the request, then return its event stream; the stream's last event is its DelegationResult."""
        validate(request)
        existing = await self._delegations.get(request.delegation_id)
        if existing is not None and existing.outcome is None and request.delegation_id in self._running:
            # Running here for a caller that went away (a supervisor that stopped): it is being cancelled.
            existing = await self._after_interruption(request.delegation_id)
        if existing is not None:
            check_same_request(existing, request)
            if existing.outcome is not None and not existing.interrupted:
                return _replay(existing)
            if existing.outcome is None:
                raise Unavailable(
                    f"delegation {request.delegation_id!r} is running on {existing.worker_id or 'another worker'}; "
                    "once that worker's lease lapses it can be taken up again",
                    reason=ErrorReason.DELEGATION_RUNNING,
                    metadata={"delegation_id": request.delegation_id, "worker_id": existing.worker_id},
                )
        assert request.role is not None
        if ROLES[request.role].needs_monitor and not self._limits.compute:
            raise FailedPrecondition(
                f"ROLE_{request.role.name} needs a monitor for its tools, and this worker has none "
                "(QUARRY_WORKER_MONITOR_ADDRESS); send it to a worker that has one",
                reason=ErrorReason.MONITOR_NOT_CONFIGURED,
            )
        if self._closing:
            raise Unavailable("this worker is shutting down; try another", reason=ErrorReason.SHUTTING_DOWN)
        if len(self._admitting.union(self._running)) >= self._limits.max_concurrent:
            raise ResourceExhausted(
                f"this worker already runs {self._limits.max_concurrent} delegations; try another worker or later",
                reason=ErrorReason.TOO_MANY_DELEGATIONS,
            )
        resumed = existing if existing is not None and existing.interrupted else None
        conversation_id = resumed.conversation_id if resumed is not None else ids.new_conversation_id()
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._admitting.add(request.delegation_id)  # holds the slot across the await: no overshoot
        self._admitted.clear()
        try:
            # Shielded: once the row says "running", a task that ends it must exist, even if our caller
            # is cancelled meanwhile (the task then runs to its recorded outcome unobserved).
            task = await asyncio.shield(self._admit(request, conversation_id, queue, resumed=resumed is not None))
        finally:
            self._admitting.discard(request.delegation_id)
            if not self._admitting:
                self._admitted.set()
        return self._stream(request, conversation_id, task, queue)

    async def _admit(
        self, request: DelegationRequest, conversation_id: str, queue: asyncio.Queue[Event], *, resumed: bool
    ) -> asyncio.Task[DelegationResult]:
        assert request.role is not None
        opening: list[Message] | None = None
        if resumed:  # an interrupted delegation goes on from its recorded conversation
            if not await self._delegations.reopen(request.delegation_id):
                raise Unavailable(
                    f"delegation {request.delegation_id!r} was taken up by another call meanwhile",
                    reason=ErrorReason.DELEGATION_RUNNING,
                    metadata={"delegation_id": request.delegation_id},
                )
            log.info("delegation %s goes on from its recorded conversation", request.delegation_id)
        else:
            opening = [system(ROLES[request.role].instructions), user(task_message(request))]
            # Refuses a delegation_id already running; creates the conversation in the same transaction.
            await self._delegations.start(request, conversation_id, opening, tier_of(request))
        task = asyncio.create_task(self._runner.execute(request, conversation_id, opening, queue))
        self._running[request.delegation_id] = task
        task.add_done_callback(lambda _: self._running.pop(request.delegation_id, None))
        return task

    async def _stream(
        self,
        request: DelegationRequest,
        conversation_id: str,
        task: asyncio.Task[DelegationResult],
        queue: asyncio.Queue[Event],
    ) -> AsyncIterator[Event]:
        try:
            tier = tier_of(request)
            model = self._models[tier].settings.model
            yield Started(request.delegation_id, conversation_id, self._delegations.worker_id, tier, model)
            while True:
                if not queue.empty():  # already there (a turn's events come in bursts): no waiting machinery
                    event = queue.get_nowait()
                else:
                    getter = asyncio.ensure_future(queue.get())
                    await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        if queue.empty():  # the run ended without reporting: never leave the caller waiting
                            yield self._lost(request, conversation_id, task)
                            return
                        continue
                    event = getter.result()
                yield event
                if isinstance(event, DelegationResult):
                    return
        finally:
            if not task.done():  # the caller went away: cancel the model call and the tools too
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(task)

    async def _after_interruption(self, delegation_id: str) -> DelegationRecord | None:
        """The record of a delegation running here once its task has ended (within a bound)."""
        task = self._running.get(delegation_id)
        if task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), _INTERRUPTION_WAIT_SECONDS)
        return await self._delegations.get(delegation_id)

    def _lost(
        self, request: DelegationRequest, conversation_id: str, task: asyncio.Task[DelegationResult]
    ) -> DelegationResult:
        log.error("delegation %s ended without an outcome", request.delegation_id)
        return DelegationResult(
            delegation_id=request.delegation_id,
            tool_call_id=request.tool_call_id,
            conversation_id=conversation_id,
            error_code=DelegationErrorCode.CANCELLED if task.cancelled() else DelegationErrorCode.INTERNAL,
            error_message="the delegation ended without a result",
            worker_id=self._delegations.worker_id,
        )

    async def close(self, finish_within: float = 0.0) -> None:
        """Let running delegations finish for up to `finish_within` seconds, then cancel the rest; each
        reports and records its outcome (a cancelled one included), so nothing is left half-written."""
        self._closing = True
        with contextlib.suppress(TimeoutError):  # admissions under way get their task first
            await asyncio.wait_for(self._admitted.wait(), max(finish_within, 1.0))
        tasks = list(self._running.values())
        if tasks and finish_within > 0:
            await asyncio.wait(tasks, timeout=finish_within)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._leases.stop()


async def _replay(record: DelegationRecord) -> AsyncIterator[Event]:
    assert record.outcome is not None
    yield Started(record.delegation_id, record.conversation_id, record.worker_id, record.tier, record.outcome.model)
    yield record.outcome
