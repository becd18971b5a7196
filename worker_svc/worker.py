"""Runs delegations: one bounded agent run per Delegate call, always ending in one DelegationResult.

Each delegation gets a fresh conversation (never the scratchpad thread), the
tools its role subscribes to, the model of its tier, and hard bounds: turns,
tokens and a deadline. A role with a structured output (claim-verifier,
citation auditor, adjudicator) is blind to all but its contract, ends with its
submit tool, and has that output checked (worker_svc.outputs) before the
worker records it on the scratchpad; a researcher promotes findings itself.
The outcome is recorded before it is sent, so a repeated Delegate with the
same delegation_id returns it without running again. A provider failure, an
exhausted budget, a deadline and a cancellation are distinct failures, and a
failure never carries the partial prose the model produced before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from opentelemetry import trace

from quarry import ids
from quarry.agent.conversation import ConversationStore
from quarry.agent.loop import (
    DEFAULT_MAX_TURNS,
    AgentRun,
    LoopLimits,
    LoopObserver,
    TokenBudgetExhausted,
    TurnBudgetExhausted,
)
from quarry.agent.messages import Message, ToolCall, system, user
from quarry.agent.model import ModelClient, ProviderError
from quarry.agent.tools import ToolOutcome
from quarry.agent.usage import Usage
from quarry.errors import (
    ErrorReason,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from quarry.lease import LeaseKeeper, LeaseTerms
from quarry.records.research import CitationAudit, ClaimVerdict, InputRefs, ResearchRecord
from quarry.telemetry import meter, tracer
from quarry.vocabulary import DelegationErrorCode, DelegationResult, Source, Tier
from worker_svc.model import DelegationRecord, DelegationRequest, Event, Progress, Started
from worker_svc.outputs import OutputGate, describe
from worker_svc.roles import MONITOR_CAPABILITIES, ROLES
from worker_svc.store import DelegationStore
from worker_svc.tools import DelegationContext, tools_for

log = logging.getLogger(__name__)

MAX_TURNS_LIMIT = 64
MAX_OBJECTIVE_CHARS = 16_000
# As many as the supervisor's delegate_research tool may ask for; a criterion is a sentence, an input
# ref a scratchpad entry or a URL (the scratchpad's longest).
MAX_CRITERIA = 10
MAX_CRITERION_CHARS = 1000
MAX_INPUT_REFS = 20
MAX_INPUT_REF_CHARS = 2048
MAX_TIMEOUT_SECONDS = 24 * 3600
# A monitor's workspace id ("ws-" and hex digits today); the monitor checks it exactly.
_WORKSPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

_ACTIVE = meter.create_up_down_counter("quarry.delegations.active", description="delegations running on this worker")


def _outcome_label(outcome: DelegationResult) -> str:
    return "succeeded" if outcome.succeeded else str(outcome.error_code or "failed")


@dataclass(frozen=True)
class WorkerLimits:
    max_concurrent: int = 64
    default_timeout_seconds: float = 600.0
    context_tokens: int = 96_000
    # Whether a monitor is configured, so that roles get the capabilities that ask it (an engineer needs it).
    compute: bool = False
    # A running delegation whose worker has not renewed its lease for this long is ended as failed.
    lease_seconds: float = 30.0


def validate(request: DelegationRequest) -> None:
    violations = ids.violations(
        ids.DELEGATION_ID.check("delegation_id", request.delegation_id),
        ids.RUN_REFERENCE.check("run_id", request.run_id),
        ids.TOOL_CALL_ID.check("tool_call_id", request.tool_call_id, when_missing=None),
        ids.THREAD_ID.check("scratchpad_thread_id", request.scratchpad_thread_id),
    )
    if not request.objective.strip():
        violations.append(FieldViolation("task.objective", "required"))
    elif len(request.objective) > MAX_OBJECTIVE_CHARS:
        violations.append(FieldViolation("task.objective", f"at most {MAX_OBJECTIVE_CHARS} characters"))
    elif "\x00" in request.objective:
        violations.append(FieldViolation("task.objective", "must not contain NUL characters"))
    if len(request.question) > MAX_OBJECTIVE_CHARS:
        violations.append(FieldViolation("task.question", f"at most {MAX_OBJECTIVE_CHARS} characters"))
    elif "\x00" in request.question:
        violations.append(FieldViolation("task.question", "must not contain NUL characters"))
    violations.extend(_list_violations("task.criteria", request.criteria, MAX_CRITERIA, MAX_CRITERION_CHARS))
    violations.extend(_list_violations("task.input_refs", request.input_refs, MAX_INPUT_REFS, MAX_INPUT_REF_CHARS))
    if request.role is None or request.role not in ROLES:
        roles = ", ".join(f"ROLE_{role.name}" for role in ROLES)
        violations.append(FieldViolation("role", f"a worker runs one of: {roles}"))
    elif ROLES[request.role].blind and not InputRefs.parse(request.input_refs).entries:
        # Its inputs are all it may see: without an entry to judge it could only spend tokens.
        violations.append(
            FieldViolation(
                "task.input_refs",
                f'a ROLE_{request.role.name} task names the scratchpad entries it judges (sequence numbers, e.g. "12")',
            )
        )
    violations.extend(_workspace_violations(request))
    if not 0 <= request.max_turns <= MAX_TURNS_LIMIT:
        violations.append(FieldViolation("budget.max_turns", f"between 1 and {MAX_TURNS_LIMIT} (0: default)"))
    if not 0 <= request.timeout_seconds <= MAX_TIMEOUT_SECONDS:
        violations.append(FieldViolation("budget.timeout", f"between 0 and {MAX_TIMEOUT_SECONDS} seconds"))
    if request.max_tokens < 0:
        violations.append(FieldViolation("budget.max_tokens", "must not be negative"))
    if violations:
        raise InvalidArgument(violations)


def _workspace_violations(request: DelegationRequest) -> list[FieldViolation]:
    """An engineer works in the workspace its task names; no other role is given one."""
    field, workspace_id = "task.workspace_id", request.workspace_id
    if request.role is None or request.role not in ROLES:
        return []  # the role's own violation says what is wrong
    if ROLES[request.role].works_in_workspace and not workspace_id:
        return [FieldViolation(field, f"required for ROLE_{request.role.name}: the monitor's workspace it works in")]
    if workspace_id and not ROLES[request.role].works_in_workspace:
        roles = ", ".join(f"ROLE_{role.name}" for role, spec in ROLES.items() if spec.works_in_workspace)
        return [FieldViolation(field, f"only {roles} works in a workspace")]
    if workspace_id and not _WORKSPACE_ID.fullmatch(workspace_id):
        return [FieldViolation(field, "a workspace id from the monitor's OpenWorkspace")]
    return []


def _list_violations(field: str, items: tuple[str, ...], max_items: int, max_chars: int) -> list[FieldViolation]:
    """A bounded list of short texts without NUL (which PostgreSQL cannot store)."""
    if len(items) > max_items:
        return [FieldViolation(field, f"at most {max_items} items")]
    found = []
    for index, item in enumerate(items):
        if len(item) > max_chars:
            found.append(FieldViolation(f"{field}[{index}]", f"at most {max_chars} characters"))
        elif "\x00" in item:
            found.append(FieldViolation(f"{field}[{index}]", "must not contain NUL characters"))
    return found


def task_message(request: DelegationRequest) -> str:
    """The contract as the model reads it: nothing else of the run reaches a blind role."""
    parts = [f"Research question: {request.question}"] if request.question else []
    parts.append(f"Task: {request.objective}")
    if request.criteria:
        parts.append("Criteria:\n" + "\n".join(f"- {c}" for c in request.criteria))
    if request.input_refs:
        parts.append("Inputs:\n" + "\n".join(f"- {r}" for r in request.input_refs))
    return "\n\n".join(parts)


class _Progress(LoopObserver):
    """Turns loop callbacks into Progress events on the delegation's queue."""

    def __init__(self, delegation_id: str, context: DelegationContext, queue: asyncio.Queue[Event]) -> None:
        self._id = delegation_id
        self._context = context
        self._queue = queue
        self._reported = 0
        self.max_turns = 0

    async def turn_started(self, turn: int, max_turns: int) -> None:
        self.max_turns = max_turns
        if self._context.gate is not None:
            self._context.gate.begin_turn(turn)
        await self._queue.put(Progress(self._id, turn, max_turns, "turn", f"turn {turn} of {max_turns}"))

    async def tool_called(self, turn: int, call: ToolCall) -> None:
        await self._queue.put(Progress(self._id, turn, self.max_turns, "tool", f"calling {call.name}", call.name))

    async def tool_finished(self, turn: int, outcome: ToolOutcome) -> None:
        if self._context.gate is not None:
            self._context.gate.observe(outcome)
        await self.report_promoted(turn)

    async def report_promoted(self, turn: int) -> None:
        """An event for each entry promoted since the last report."""
        while self._reported < len(self._context.promoted):
            sequence_no = self._context.promoted[self._reported]
            self._reported += 1
            await self._queue.put(
                Progress(self._id, turn, self.max_turns, "appended", f"scratchpad entry {sequence_no}", "", sequence_no)
            )


class Worker:
    def __init__(
        self,
        *,
        models: Mapping[Tier, ModelClient],
        conversations: ConversationStore,
        delegations: DelegationStore,
        context_for: Callable[[DelegationRequest], DelegationContext],
        limits: WorkerLimits,
    ) -> None:
        self._models = models
        self._conversations = conversations
        self._delegations = delegations
        self._context_for = context_for
        self._limits = limits
        self._running: dict[str, asyncio.Task[DelegationResult]] = {}
        self._admitting = 0
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

    async def delegate(self, request: DelegationRequest) -> AsyncIterator[Event]:
        """Check the request, then return its event stream; the stream's last event is its DelegationResult."""
        validate(request)
        existing = await self._delegations.get(request.delegation_id)
        if existing is not None and existing.outcome is not None:
            _check_same_request(existing, request)
            return _replay(existing)
        assert request.role is not None
        if ROLES[request.role].needs_monitor and not self._limits.compute:
            raise FailedPrecondition(
                f"ROLE_{request.role.name} needs a monitor for its tools, and this worker has none "
                "(QUARRY_WORKER_MONITOR_ADDRESS); send it to a worker that has one",
                reason=ErrorReason.MONITOR_NOT_CONFIGURED,
            )
        if self._closing:
            raise Unavailable("this worker is shutting down; try another", reason=ErrorReason.SHUTTING_DOWN)
        if len(self._running) + self._admitting >= self._limits.max_concurrent:
            raise ResourceExhausted(
                f"this worker already runs {self._limits.max_concurrent} delegations; try another worker or later",
                reason=ErrorReason.TOO_MANY_DELEGATIONS,
            )
        conversation_id = ids.new_conversation_id()
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._admitting += 1  # holds the slot across the await, so concurrent calls cannot overshoot
        self._admitted.clear()
        try:
            # Shielded: once the row says "running", a task that ends it must exist, even if our caller
            # is cancelled meanwhile (the task then runs to its recorded outcome unobserved).
            task = await asyncio.shield(self._admit(request, conversation_id, queue))
        finally:
            self._admitting -= 1
            if not self._admitting:
                self._admitted.set()
        return self._stream(request, conversation_id, task, queue)

    async def _admit(
        self, request: DelegationRequest, conversation_id: str, queue: asyncio.Queue[Event]
    ) -> asyncio.Task[DelegationResult]:
        assert request.role is not None
        opening = [system(ROLES[request.role].instructions), user(task_message(request))]
        # Refuses a delegation_id already running; creates the conversation in the same transaction.
        await self._delegations.start(request, conversation_id, opening, self._tier(request))
        task = asyncio.create_task(self._execute(request, conversation_id, opening, queue))
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
            tier = self._tier(request)
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

    async def _execute(
        self, request: DelegationRequest, conversation_id: str, opening: list[Message], queue: asyncio.Queue[Event]
    ) -> DelegationResult:
        attributes = {
            "quarry.delegation_id": request.delegation_id,
            "quarry.run_id": request.run_id,
            "quarry.conversation_id": conversation_id,
            "quarry.role": str(request.role),
        }
        _ACTIVE.add(1)
        try:
            with tracer.start_as_current_span("worker delegation", attributes=attributes) as span:
                outcome = await self._run(request, conversation_id, opening, queue)
                log.info("delegation %s %s", request.delegation_id, _outcome_label(outcome))
                span.set_attribute("quarry.delegation.outcome", _outcome_label(outcome))
                if not outcome.succeeded:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.error_message))
                return outcome
        finally:
            _ACTIVE.add(-1)

    def _tier(self, request: DelegationRequest) -> Tier:
        assert request.role is not None
        return request.tier or ROLES[request.role].tier

    async def _run(
        self, request: DelegationRequest, conversation_id: str, opening: list[Message], queue: asyncio.Queue[Event]
    ) -> DelegationResult:
        """Run the delegation; whatever happens, record and queue exactly one DelegationResult."""
        assert request.role is not None
        spec = ROLES[request.role]
        tier = self._tier(request)
        model = self._models[tier]
        run: AgentRun[DelegationContext] | None = None
        context: DelegationContext | None = None
        timeout = request.timeout_seconds or self._limits.default_timeout_seconds
        deadline = asyncio.timeout(timeout)

        def ended(
            code: DelegationErrorCode | None,
            message: str = "",
            summary: str = "",
            output: tuple[ResearchRecord, int] | None = None,
        ) -> DelegationResult:
            workspace = context.workspace if context else None
            return DelegationResult(
                delegation_id=request.delegation_id,
                tool_call_id=request.tool_call_id,
                conversation_id=conversation_id,
                summary=summary if code is None else "",  # partial prose is never a result
                error_code=code,
                error_message=message,
                promoted=tuple(context.promoted) if context else (),
                turns=run.turns if run else 0,
                usage=run.usage if run else Usage(),
                worker_id=self._delegations.worker_id,
                # What an engineer's tools did, as they recorded it: kept on failure too.
                jobs=tuple(workspace.jobs) if workspace else (),
                files_changed=tuple(workspace.files_changed) if workspace else (),
                output_kind=output[0].record_kind() if output else "",
                output_json=output[0].model_dump_json() if output else "",
                output_sequence_no=output[1] if output else 0,
                tier=tier,
                model=model.settings.model,
            )

        gate: OutputGate | None = None
        try:
            context = self._context_for(request)
            if spec.output is not None:  # blind, and ends with its record
                context.inputs = InputRefs.parse(request.input_refs)
                context.gate = gate = OutputGate(request.role, spec.output, context.inputs, context.read)
            observer = _Progress(request.delegation_id, context, queue)
            limits = LoopLimits(
                max_turns=request.max_turns or DEFAULT_MAX_TURNS,
                max_tokens=request.max_tokens,
                context_tokens=self._limits.context_tokens,
            )
            available = MONITOR_CAPABILITIES if self._limits.compute else frozenset()
            tools = tools_for(spec.capabilities_given(available), spec.output)
            run = AgentRun(
                model,
                tools,
                self._conversations,
                conversation_id,
                limits,
                observer,
                agent="worker",
                finished=gate.finished if gate else None,
            )
            history = list(opening)
            async with deadline:
                answer = await run.run(context, history=history)
                if gate is None:
                    outcome = ended(None, summary=answer)
                else:
                    await self._settle(gate, run, context, history, answer, conversation_id)
                    if gate.failure is not None:
                        outcome = ended(gate.failure.code, gate.failure.message)
                    else:
                        assert gate.accepted is not None
                        number = await self._record(request, context, gate.accepted)
                        await observer.report_promoted(run.turns)
                        outcome = ended(None, summary=describe(gate.accepted), output=(gate.accepted, number))
        except TurnBudgetExhausted as error:
            if gate is not None and gate.pending is not None:  # the turn it needed to repair its output was not left
                outcome = ended(gate.pending.code, f"{gate.pending.message}; no turn was left to repair it")
            else:
                outcome = ended(DelegationErrorCode.TURN_BUDGET_EXHAUSTED, str(error))
        except TokenBudgetExhausted as error:
            outcome = ended(DelegationErrorCode.TOKEN_BUDGET_EXHAUSTED, str(error))
        except ProviderError as error:
            outcome = ended(DelegationErrorCode.PROVIDER_ERROR, str(error))
        except TimeoutError as error:
            if not deadline.expired():  # a timeout from somewhere else is a fault, not the deadline
                log.exception("delegation %s failed", request.delegation_id)
                outcome = ended(DelegationErrorCode.INTERNAL, f"the worker failed: {type(error).__name__}")
            else:
                outcome = ended(
                    DelegationErrorCode.DEADLINE_EXCEEDED, f"the delegation ran past its {timeout:g} s deadline"
                )
        except asyncio.CancelledError:
            cancelled = ended(DelegationErrorCode.CANCELLED, "the delegation was cancelled")
            queue.put_nowait(cancelled)  # a caller still listening (a shutdown) gets its correlated result
            with contextlib.suppress(Exception):
                await asyncio.shield(self._delegations.finish(cancelled))
            raise
        except Exception as error:
            log.exception("delegation %s failed", request.delegation_id)
            outcome = ended(DelegationErrorCode.INTERNAL, f"the worker failed: {type(error).__name__}")
        try:
            # Recorded before it is reported; shielded, so a cancellation now cannot leave it half-done.
            await asyncio.shield(self._delegations.finish(outcome))
        except asyncio.CancelledError:
            queue.put_nowait(outcome)  # the write goes on; the caller still gets the real outcome
            raise
        except Exception:
            # The caller still gets its result; GetDelegation may say "running" until the database is back.
            log.exception("could not record the outcome of delegation %s", request.delegation_id)
        queue.put_nowait(outcome)
        return outcome

    async def _settle(
        self,
        gate: OutputGate,
        run: AgentRun[DelegationContext],
        context: DelegationContext,
        history: list[Message],
        answer: str,
        conversation_id: str,
    ) -> None:
        """Bring a structured role's output to accepted or failed. A run that ended in prose made an attempt
        too: a first failed one gets the repair turn, told what was wrong; the next answer is the last."""
        if gate.settled:
            return
        repair = gate.answer(answer)
        if gate.settled:
            return
        prompt = user(repair)
        await self._conversations.append(conversation_id, [prompt])
        history.append(prompt)
        answer = await run.run(context, history=history)
        if not gate.settled:
            gate.answer(answer)

    async def _record(self, request: DelegationRequest, context: DelegationContext, output: ResearchRecord) -> int:
        """Append an accepted output as its entry (an audit's objections after it); its sequence number.

        Request ids derive from the delegation, so a retried append writes nothing twice.
        """
        sources: tuple[Source, ...] = ()
        if isinstance(output, ClaimVerdict) and output.quote is not None:
            page = context.read[output.quote.url]
            sources = (Source(output.quote.url, page.title, output.quote.excerpt),)
        appended = await context.scratchpad.append(
            context.scratchpad_thread_id,
            kind=output.entry_kind,
            author=context.author,
            content=output.model_dump_json(),
            sources=sources,
            request_id=_request_id(request.delegation_id, "output"),
        )
        number = appended.entry.sequence_no
        context.promoted.append(number)
        if isinstance(output, CitationAudit):
            for index, objection in enumerate(output.objections(number)):
                raised = await context.scratchpad.append(
                    context.scratchpad_thread_id,
                    kind=objection.entry_kind,
                    author=context.author,
                    content=objection.model_dump_json(),
                    request_id=_request_id(request.delegation_id, f"objection-{index}"),
                )
                context.promoted.append(raised.entry.sequence_no)
        return number

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


def _request_id(delegation_id: str, part: str) -> str:
    """A scratchpad request id for one of a delegation's own appends (within the 128 characters allowed)."""
    return f"dlg-{hashlib.sha256(delegation_id.encode()).hexdigest()[:40]}/{part}"


def _check_same_request(record: DelegationRecord, request: DelegationRequest) -> None:
    """A delegation_id names one request: a different one under the same id is refused, not answered."""
    if (record.run_id, record.tool_call_id, record.objective, record.scratchpad_thread_id, record.workspace_id) != (
        request.run_id,
        request.tool_call_id,
        request.objective,
        request.scratchpad_thread_id,
        request.workspace_id,
    ):
        raise FailedPrecondition(
            f"delegation_id {request.delegation_id!r} was already used for a different request",
            reason=ErrorReason.DELEGATION_ID_REUSED,
            metadata={"delegation_id": request.delegation_id},
        )


async def _replay(record: DelegationRecord) -> AsyncIterator[Event]:
    assert record.outcome is not None
    yield Started(record.delegation_id, record.conversation_id, record.worker_id, record.tier, record.outcome.model)
    yield record.outcome
