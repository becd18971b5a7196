"""One admitted delegation's agent run, always ending in one recorded DelegationResult.

Each delegation gets a fresh conversation (never the scratchpad thread), the
tools its role subscribes to, the model of its tier, and hard bounds: turns,
tokens and a deadline. A role with a structured output (claim-verifier,
citation auditor, adjudicator) is blind to all but its contract, ends with its
submit tool, and has that output checked (worker_svc.outputs) before the
worker records it on the scratchpad; a researcher promotes findings itself.
The outcome is recorded before it is sent. A provider failure, an exhausted
budget, a deadline and a cancellation are distinct failures, and a failure
never carries the partial prose the model produced before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence

from opentelemetry import trace

from quarry.agent.conversation import ConversationStore
from quarry.agent.loop import (
    DEFAULT_MAX_TURNS,
    AgentRun,
    LoopLimits,
    LoopObserver,
    TokenBudgetExhausted,
    TurnBudgetExhausted,
)
from quarry.agent.messages import Message, ToolCall, user
from quarry.agent.model import ModelClient, ProviderError
from quarry.agent.tools import ToolError, ToolOutcome
from quarry.agent.usage import Usage
from quarry.recording import Recordings, recording
from quarry.records.research import CitationAudit, ClaimVerdict, InputRefs, ResearchRecord
from quarry.telemetry import meter, tracer
from quarry.vocabulary import DelegationErrorCode, DelegationResult, Source, Tier
from worker_svc.capabilities import MONITOR_CAPABILITIES, Capability
from worker_svc.delegations import DelegationRequest, Event, Progress
from worker_svc.outputs import OutputGate, describe
from worker_svc.roles import ROLES
from worker_svc.store import DelegationStore
from worker_svc.tools import DelegationContext, tools_for

log = logging.getLogger(__name__)

_ACTIVE = meter.create_up_down_counter("quarry.delegations.active", description="delegations running on this worker")


def _outcome_label(outcome: DelegationResult) -> str:
    return "succeeded" if outcome.succeeded else str(outcome.error_code or "failed")


def tier_of(request: DelegationRequest) -> Tier:
    """The tier a delegation runs on: the one asked for, else its role's."""
    assert request.role is not None
    return request.tier or ROLES[request.role].tier


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


class DelegationRunner:
    """Runs admitted delegations: the agent loop, the output gate, the recording of the outcome."""

    def __init__(
        self,
        *,
        models: Mapping[Tier, ModelClient],
        conversations: ConversationStore,
        delegations: DelegationStore,
        context_for: Callable[[DelegationRequest], DelegationContext],
        default_timeout_seconds: float,
        context_tokens: int,
        compute: bool,
        recordings: Recordings | None = None,
    ) -> None:
        self._models = models
        # Where each delegation's HTTP exchanges are recorded for its run's replay (None: not recorded).
        self._recordings = recordings
        self._conversations = conversations
        self._delegations = delegations
        self._context_for = context_for
        self._default_timeout_seconds = default_timeout_seconds
        self._context_tokens = context_tokens
        # Whether a monitor is configured, so that roles get the capabilities that ask it.
        self._compute = compute

    async def execute(
        self,
        request: DelegationRequest,
        conversation_id: str,
        opening: list[Message] | None,
        queue: asyncio.Queue[Event],
    ) -> DelegationResult:
        """Run an admitted delegation, traced and counted; always its one DelegationResult. Without `opening`
        it goes on with an interrupted delegation's recorded conversation."""
        attributes = {
            "quarry.delegation_id": request.delegation_id,
            "quarry.run_id": request.run_id,
            "quarry.conversation_id": conversation_id,
            "quarry.role": str(request.role),
        }
        _ACTIVE.add(1)
        try:
            with (
                tracer.start_as_current_span("worker delegation", attributes=attributes) as span,
                recording(request.run_id, request.delegation_id, self._recordings),
            ):
                outcome = await self._run(request, conversation_id, opening, queue)
                log.info("delegation %s %s", request.delegation_id, _outcome_label(outcome))
                span.set_attribute("quarry.delegation.outcome", _outcome_label(outcome))
                if not outcome.succeeded:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.error_message))
                return outcome
        finally:
            _ACTIVE.add(-1)

    async def _run(
        self,
        request: DelegationRequest,
        conversation_id: str,
        opening: list[Message] | None,
        queue: asyncio.Queue[Event],
    ) -> DelegationResult:
        """Run the delegation; whatever happens, record and queue exactly one DelegationResult."""
        assert request.role is not None
        spec = ROLES[request.role]
        tier = tier_of(request)
        model = self._models[tier]
        run: AgentRun[DelegationContext] | None = None
        context: DelegationContext | None = None
        timeout = request.timeout_seconds or self._default_timeout_seconds
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
                context.gate = gate = OutputGate(
                    request.role, spec.output, context.inputs, context.read, context.listed
                )
            observer = _Progress(request.delegation_id, context, queue)
            limits = LoopLimits(
                max_turns=request.max_turns or DEFAULT_MAX_TURNS,
                max_tokens=request.max_tokens,
                context_tokens=self._context_tokens,
            )
            available = (MONITOR_CAPABILITIES if self._compute else frozenset()) | (
                {Capability.PAPERS} if context.papers is not None else frozenset()
            )
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
            if opening is not None:
                history = list(opening)
            else:
                history = await self._conversations.history(conversation_id)
                await _restore(context, history, request.delegation_id)
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
            with contextlib.suppress(Exception):  # interrupted: the same Delegate goes on with it later
                await asyncio.shield(self._delegations.finish(cancelled, interrupted=True))
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


# The tools whose `url` argument is a page the delegation read (and may cite).
_PAGE_TOOLS = frozenset({"read_web_page", "search_web_page", "scroll_web_page"})


async def _restore(context: DelegationContext, history: Sequence[Message], delegation_id: str) -> None:
    """What an interrupted delegation's tools had gathered, rebuilt from the record: the entries it promoted
    (the scratchpad's, by author) and the pages it read (read again, from the page cache where it has them),
    so that what it goes on to promote may cite them."""
    entries = await context.scratchpad.read_all(context.scratchpad_thread_id)
    context.promoted.extend(e.sequence_no for e in entries if e.author.principal_id == delegation_id)
    urls = dict.fromkeys(
        url
        for message in history
        for call in message.tool_calls
        if call.name in _PAGE_TOOLS and isinstance(url := _argument(call, "url"), str)
    )
    for url in urls:
        with contextlib.suppress(ToolError):  # a page that cannot be read now is not citable: as if unread
            await context.page(url)


def _argument(call: ToolCall, name: str) -> object:
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        return None
    return arguments.get(name) if isinstance(arguments, dict) else None


def _request_id(delegation_id: str, part: str) -> str:
    """A scratchpad request id for one of a delegation's own appends (within the 128 characters allowed)."""
    return f"dlg-{hashlib.sha256(delegation_id.encode()).hexdigest()[:40]}/{part}"
