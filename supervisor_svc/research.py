"""One research run: seed the scratchpad, delegate, re-read, synthesise; always one terminal event.

The supervisor runs the same bounded loop as the workers (quarry.agent.loop)
with three tools: delegate_research, read_scratchpad and append_scratchpad.
Its context only ever holds its own turns, short delegation results and
scratchpad reads: worker transcripts stay with the workers. When the research
phase ends — the model is done, the turn bound or the token budget is reached —
the report is written from the verified findings in the scratchpad.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from google.protobuf import duration_pb2
from opentelemetry import trace
from pydantic import BaseModel, Field
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from quarry.agent.conversation import ConversationStore
from quarry.agent.loop import AgentRun, LoopLimits, LoopObserver, TurnBudgetExhausted
from quarry.agent.messages import ToolCall, system, user
from quarry.agent.model import ModelClient, ProviderError
from quarry.agent.scratchpad_tools import SCRATCHPAD_TOOLS, SourceParam, render_entries
from quarry.agent.tools import Tool, ToolError, ToolOutcome, ToolRegistry, current_call
from quarry.client import ScratchpadClient
from quarry.errors import Unavailable
from quarry.telemetry import meter, tracer
from quarry.v1 import common_pb2, scratchpad_pb2, supervisor_pb2, worker_pb2
from supervisor_svc import events
from supervisor_svc.delegation import DelegationClient
from supervisor_svc.events import RunEventLog, TextStream
from supervisor_svc.model import (
    DEFAULT_SUPERVISOR_TURNS,
    Report,
    RunErrorCode,
    RunRecord,
    RunState,
    RunUsage,
    TierUsage,
)
from supervisor_svc.store import RunEnded
from supervisor_svc.synthesis import CitationFilter, synthesis_messages, verified_sources

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "You are the supervisor of a research team. The question is in the scratchpad's seed. Split it into "
    "bounded research tasks and give each to a worker with delegate_research; several calls in one reply run "
    "in parallel. Workers search, read and verify sources, and promote verified findings to the shared "
    "scratchpad. After delegations, read_scratchpad to see what was promoted, then decide whether more research "
    "is needed. You may add notes or markers with append_scratchpad. When the findings suffice, or further "
    "research would not help, reply without calling a tool: a few lines on what the report should cover. The "
    "report is then written from the scratchpad's verified findings."
)


class DelegateParams(BaseModel):
    objective: str = Field(min_length=1, max_length=4000, description="the research task, self-contained")
    criteria: list[str] = Field(default_factory=list, max_length=10, description="what a good answer must show")
    input_refs: list[str] = Field(
        default_factory=list, max_length=20, description="scratchpad entries or URLs to start from"
    )
    role: Literal["researcher", "verifier"] = "researcher"


# Promoted entries shown with a delegation's result, at most (the rest stay one read_scratchpad away).
_MAX_PROMOTED_CHARS = 8000
_ROLES = {"researcher": common_pb2.ROLE_RESEARCHER, "verifier": common_pb2.ROLE_VERIFIER}


_DELEGATIONS = meter.create_counter("quarry.delegations", description="delegations ended, by outcome")


def _outcome_label(result: worker_pb2.DelegationResult) -> str:
    if result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED:
        return "succeeded"
    return common_pb2.DelegationErrorCode.Name(result.error.code).removeprefix("DELEGATION_ERROR_CODE_").lower()


class BudgetSpent(Exception):
    """The run's token budget is reached: research stops and the report is written."""


@dataclass
class RunDependencies:
    model: ModelClient
    conversations: ConversationStore
    scratchpad: ScratchpadClient
    delegations: DelegationClient
    default_timeout_seconds: float
    default_parallel: int
    context_tokens: int


@dataclass
class SupervisorContext:
    """What the supervisor's tools share during one run (it satisfies ScratchpadAccess)."""

    research: ResearchRun
    scratchpad: ScratchpadClient
    scratchpad_thread_id: str
    author: common_pb2.Principal
    promoted: list[int] = field(default_factory=list)

    def verify_sources(self, kind: str, sources: Sequence[SourceParam]) -> None:
        if sources:
            raise ToolError("the supervisor cites nothing itself; sourced findings come from workers")


async def delegate_research(params: DelegateParams, context: SupervisorContext) -> str:
    return await context.research.delegate(params, current_call())


SUPERVISOR_TOOLS: list[Tool[Any, SupervisorContext]] = [
    Tool(
        "delegate_research",
        "Give one bounded research task to a worker; returns its result once it ends. The worker reads the "
        "scratchpad itself and promotes verified findings there.",
        DelegateParams,
        delegate_research,
    ),
    *SCRATCHPAD_TOOLS,
]
REGISTRY: ToolRegistry[SupervisorContext] = ToolRegistry(SUPERVISOR_TOOLS)


def render_result(
    delegation_id: str, result: worker_pb2.DelegationResult, promoted_entries: Sequence[scratchpad_pb2.Entry] = ()
) -> str:
    """What the supervisor's context keeps of a delegation: its outcome and the entries it promoted, as the
    scratchpad holds them; never the worker's transcript."""
    promoted = ", ".join(str(n) for n in result.promoted_sequence_nos) or "none"
    if result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED:
        text = (
            f"delegation {delegation_id} succeeded in {result.turns_used} turns; scratchpad entries promoted: "
            f"{promoted}.\nWorker summary: {result.summary}"
        )
    else:
        code = common_pb2.DelegationErrorCode.Name(result.error.code).removeprefix("DELEGATION_ERROR_CODE_")
        text = (
            f"error: delegation {delegation_id} failed ({code}): {result.error.message}. "
            f"Scratchpad entries promoted before it failed: {promoted}."
        )
    if promoted_entries:
        entries = render_entries(promoted_entries)
        if len(entries) > _MAX_PROMOTED_CHARS:
            entries = entries[:_MAX_PROMOTED_CHARS] + "\n… (more with read_scratchpad)"
        text += f"\nPromoted entries, from the scratchpad:\n{entries}"
    return text


class _Observer(LoopObserver):
    def __init__(self, research: ResearchRun) -> None:
        self._research = research

    async def turn_started(self, turn: int, max_turns: int) -> None:
        await self._research.reasoning.flush()
        self._research.check_budget()

    async def tool_finished(self, turn: int, outcome: ToolOutcome) -> None:
        self._research.supervisor_tool_calls += 1

    async def text(self, delta: str) -> None:
        await self._research.reasoning.add(delta)


class ResearchRun:
    def __init__(self, record: RunRecord, log_: RunEventLog, deps: RunDependencies) -> None:
        self.record = record
        self.run_id = record.run_id
        self._log = log_
        self._deps = deps
        options = record.options
        self._max_turns = options.max_supervisor_turns or DEFAULT_SUPERVISOR_TURNS
        self._timeout = options.timeout_seconds or deps.default_timeout_seconds
        self._parallel = asyncio.Semaphore(options.max_parallel_delegations or deps.default_parallel)
        self._deadline = 0.0
        self._delegations = 0
        self._agent: AgentRun[SupervisorContext] | None = None
        self._synthesis_usage = TierUsage()
        self.worker_usage = TierUsage()
        self.supervisor_tool_calls = 0
        self._turns_without_call = 0
        self._in_flight = 0
        self.cancel_reason = "cancelled"
        self.reasoning = TextStream(events.reasoning, self._emit_one)
        self._content = TextStream(events.content, self._emit_one)
        self._entries_published = 0
        self._entries_lock = asyncio.Lock()

    # -- usage and budget -------------------------------------------------------------------

    def usage(self) -> RunUsage:
        agent = self._agent
        own = TierUsage(
            agent.usage.input_tokens if agent else 0,
            agent.usage.output_tokens if agent else 0,
            (agent.turns - self._turns_without_call) if agent else 0,
            self.supervisor_tool_calls,
        )
        return RunUsage(supervisor=own + self._synthesis_usage, workers=self.worker_usage)

    def _tokens_left(self) -> int | None:
        budget = self.record.options.max_tokens
        return None if not budget else budget - self.usage().total.tokens

    def _budget_spent(self) -> bool:
        left = self._tokens_left()
        return left is not None and left <= 0

    def check_budget(self) -> None:
        """Called as a turn starts, before its model call: a spent budget ends research there."""
        if self._budget_spent():
            self._turns_without_call = 1
            raise BudgetSpent

    # -- events ---------------------------------------------------------------------------

    async def _emit_one(self, event: supervisor_pb2.RunEvent) -> None:
        await self._log.emit(event)

    async def _status(
        self,
        phase: supervisor_pb2.ResearchPhase.ValueType,
        message: str,
        *,
        values: dict[str, Any] | None = None,
        delegation_id: str = "",
        result: worker_pb2.DelegationResult | None = None,
    ) -> None:
        event = events.status(phase, message, delegation_id=delegation_id, result=result)
        await self._log.emit(event, values=values)

    async def _publish_entries(self, entries: Sequence[scratchpad_pb2.Entry]) -> None:
        """Scratchpad events for entries not yet reported, in sequence order, each once."""
        async with self._entries_lock:
            fresh = [entry for entry in entries if entry.sequence_no > self._entries_published]
            if fresh:
                await self._log.emit(*(events.scratchpad_entry(entry) for entry in fresh))
                self._entries_published = fresh[-1].sequence_no

    async def _watch_scratchpad(self) -> None:
        try:
            async for entry in self._deps.scratchpad.watch(self.record.scratchpad_thread_id):
                # Shielded: an event stored but not yet counted would be published twice by the final flush.
                await asyncio.shield(self._publish_entries([entry]))
        except Exception as error:  # live updates stop; the final read still reports every entry
            log.warning("run %s: scratchpad watch ended: %s", self.run_id, error)

    async def _flush_entries_if_possible(self) -> None:
        """Report the entries the watch has not: the run's end must not wait on, or fail with, the scratchpad."""
        try:
            entries = await self._deps.scratchpad.read_all(
                self.record.scratchpad_thread_id, after_sequence_no=self._entries_published
            )
            await self._publish_entries(entries)
        except Exception as error:
            log.warning("run %s: could not report the last scratchpad entries: %s", self.run_id, error)

    # -- delegation -----------------------------------------------------------------------

    async def delegate(self, params: DelegateParams, call: ToolCall) -> str:
        self.check_budget_for_tool()
        self._delegations += 1
        delegation_id = f"{self.run_id}.{self._delegations}.{call.id[:40]}"
        attributes = {"quarry.delegation_id": delegation_id, "quarry.run_id": self.run_id, "quarry.role": params.role}
        with tracer.start_as_current_span("delegate", attributes=attributes) as span:
            async with self._parallel:
                self.check_budget_for_tool()
                self._in_flight += 1
                try:
                    result = await self._run_delegation(params, call, delegation_id)
                finally:
                    self._in_flight -= 1
            outcome = _outcome_label(result)
            span.set_attribute("quarry.delegation.outcome", outcome)
            if result.outcome != common_pb2.DELEGATION_OUTCOME_SUCCEEDED:
                span.set_status(trace.Status(trace.StatusCode.ERROR, result.error.message[:200]))
        _DELEGATIONS.add(1, {"quarry.delegation.outcome": outcome})
        usage = result.usage
        self.worker_usage += TierUsage(usage.input_tokens, usage.output_tokens, usage.model_calls, usage.tool_calls)
        succeeded = result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED
        await self._status(
            supervisor_pb2.RESEARCH_PHASE_WORKER_COMPLETED
            if succeeded
            else supervisor_pb2.RESEARCH_PHASE_WORKER_FAILED,
            "worker finished" if succeeded else f"worker failed: {result.error.message}",
            delegation_id=delegation_id,
            result=result,
            values={"usage": self.usage().to_json()},
        )
        return render_result(delegation_id, result, await self._promoted_entries(result))

    async def _promoted_entries(self, result: worker_pb2.DelegationResult) -> list[scratchpad_pb2.Entry]:
        """Re-read what the delegation promoted: the supervisor sees findings as the scratchpad holds them."""
        numbers = set(result.promoted_sequence_nos)
        if not numbers:
            return []
        try:
            entries = await self._deps.scratchpad.read_all(
                self.record.scratchpad_thread_id, after_sequence_no=min(numbers) - 1
            )
        except Exception as error:  # the result stands without them; read_scratchpad can fetch them later
            log.warning("run %s: could not re-read promoted entries: %s", self.run_id, error)
            return []
        return [entry for entry in entries if entry.sequence_no in numbers]

    async def _run_delegation(
        self, params: DelegateParams, call: ToolCall, delegation_id: str
    ) -> worker_pb2.DelegationResult:
        # The "delegated" event is written while the call goes out (it is not on the hop to the worker);
        # the delegation's later events wait for it, so the order on the wire stays the order of events.
        announced = asyncio.ensure_future(
            self._status(
                supervisor_pb2.RESEARCH_PHASE_WORKER_DELEGATED, params.objective[:200], delegation_id=delegation_id
            )
        )

        async def progress(response: worker_pb2.DelegateResponse) -> None:
            await announced
            await self._progress(response)

        await asyncio.sleep(0)  # lets every delegation of this turn count itself in flight first
        request = worker_pb2.DelegateRequest(
            delegation_id=delegation_id,
            run_id=self.run_id,
            tool_call_id=call.id,
            scratchpad_thread_id=self.record.scratchpad_thread_id,
            task=worker_pb2.ResearchTask(
                objective=params.objective, criteria=params.criteria, input_refs=params.input_refs
            ),
            role=_ROLES[params.role],
            budget=worker_pb2.DelegationBudget(
                max_turns=self.record.options.worker_max_turns,
                max_tokens=self._worker_token_share(),
                timeout=duration_pb2.Duration(seconds=max(int(self._deadline - time.monotonic()), 1)),
            ),
        )
        try:
            return await self._deps.delegations.delegate(
                request, deadline_seconds=max(self._deadline - time.monotonic(), 1.0) + 5.0, on_event=progress
            )
        finally:
            await announced

    def _worker_token_share(self) -> int:
        """Each delegation in flight gets an equal part of what is left, so together they stay in budget."""
        left = self._tokens_left()
        return 0 if left is None else max(left // max(self._in_flight, 1), 1)

    def check_budget_for_tool(self) -> None:
        if self._budget_spent():
            raise ToolError("the run's token budget is spent: no new delegation starts")

    async def _progress(self, response: worker_pb2.DelegateResponse) -> None:
        if response.WhichOneof("event") != "progress":
            return
        progress = response.progress
        if progress.kind == worker_pb2.PROGRESS_KIND_TURN_STARTED:
            await self._status(
                supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING,
                f"turn {progress.turn} of {progress.max_turns}",
                delegation_id=progress.delegation_id,
            )

    # -- the run --------------------------------------------------------------------------

    async def execute(self) -> None:
        """Run to exactly one terminal event (unless the run already ended elsewhere)."""
        attributes = {"quarry.run_id": self.run_id, "quarry.scratchpad_thread_id": self.record.scratchpad_thread_id}
        with tracer.start_as_current_span("research run", attributes=attributes):
            log.info("run %s started", self.run_id)
            await self._execute()

    async def _execute(self) -> None:
        self._deadline = time.monotonic() + self._timeout
        watcher: asyncio.Task[None] | None = None
        try:
            async with asyncio.timeout(self._timeout):
                await self._status(
                    supervisor_pb2.RESEARCH_PHASE_STARTED,
                    "research started",
                    values={"state": RunState.RUNNING.value, "start_time": datetime.now(UTC)},
                )
                await self._seed()
                watcher = asyncio.create_task(self._watch_scratchpad())
                report = await self._research_and_report()
            await self._stop_watching(watcher)
            await self._flush_entries_if_possible()
            await self._end(events.completed(report, self.usage()), RunState.SUCCEEDED, report=report)
        except asyncio.CancelledError:
            await asyncio.shield(self._end_cancelled(watcher))
            raise
        except ProviderError as error:
            await self._fail(watcher, RunErrorCode.PROVIDER_ERROR, str(error))
        except TimeoutError:
            await self._fail(watcher, RunErrorCode.DEADLINE_EXCEEDED, f"the run ran past its {self._timeout:g} s limit")
        except Exception as error:
            log.exception("run %s failed", self.run_id)
            await self._fail(watcher, RunErrorCode.INTERNAL, f"the supervisor failed: {type(error).__name__}: {error}")

    async def _seed(self) -> None:
        thread_id = self.record.scratchpad_thread_id
        await self._deps.scratchpad.create_thread(
            thread_id=thread_id, title=self.record.question[:200], request_id=f"{self.run_id}/thread"
        )
        await self._deps.scratchpad.append(
            thread_id,
            kind=scratchpad_pb2.ENTRY_KIND_SEED,
            author=common_pb2.Principal(principal_id=self.run_id, role=common_pb2.ROLE_SUPERVISOR),
            content=f"Research question: {self.record.question}",
            request_id=f"{self.run_id}/seed",
        )

    async def _research_and_report(self) -> Report:
        await self._status(supervisor_pb2.RESEARCH_PHASE_PLANNING, "planning the research")
        conversation_id = f"sup-{self.run_id}"
        conversations = self._deps.conversations
        opening = [
            system(INSTRUCTIONS),
            user(
                f"Research question: {self.record.question}\n\nThe scratchpad holds the seed as entry 1. "
                "Plan, delegate, and check the findings."
            ),
        ]
        await conversations.create(conversation_id, opening)
        context = SupervisorContext(
            research=self,
            scratchpad=self._deps.scratchpad,
            scratchpad_thread_id=self.record.scratchpad_thread_id,
            author=common_pb2.Principal(principal_id=self.run_id, role=common_pb2.ROLE_SUPERVISOR),
        )
        limits = LoopLimits(max_turns=self._max_turns, context_tokens=self._deps.context_tokens)
        self._agent = AgentRun(
            self._deps.model, REGISTRY, conversations, conversation_id, limits, _Observer(self), agent="supervisor"
        )
        notes = ""
        token_budget = turn_budget = False
        try:
            notes = await self._agent.run(context, history=list(opening))
        except TurnBudgetExhausted:
            turn_budget = True
        except BudgetSpent:
            token_budget = True
        await self.reasoning.flush()
        reason = (
            "the token budget is spent; writing the report from what exists"
            if token_budget
            else "the turn bound is reached; writing the report from what exists"
            if turn_budget
            else "writing the report"
        )
        await self._status(supervisor_pb2.RESEARCH_PHASE_SYNTHESIZING, reason)
        return await self._synthesise(notes, token_budget=token_budget, turn_budget=turn_budget)

    async def _synthesise(self, notes: str, *, token_budget: bool, turn_budget: bool) -> Report:
        entries = await self._deps.scratchpad.read_all(self.record.scratchpad_thread_id)
        sources = verified_sources(entries)
        citations = CitationFilter({source.number: source for source in sources})
        text: list[str] = []

        async def stream(delta: str) -> None:
            safe = citations.feed(delta)
            text.append(safe)
            await self._content.add(safe)

        reply = await self._deps.model.complete(
            synthesis_messages(self.record.question, entries, sources, notes),
            (),
            call_id_prefix="report",
            on_text=stream,
        )
        rest = citations.finish()
        text.append(rest)
        await self._content.add(rest)
        await self._content.flush()
        self._synthesis_usage = TierUsage(reply.usage.input_tokens, reply.usage.output_tokens, 1, 0)
        return Report(
            markdown="".join(text),
            citations=citations.citations(),
            removed_citations=citations.removed,
            token_budget_exhausted=token_budget,
            turn_budget_exhausted=turn_budget,
        )

    # -- endings ----------------------------------------------------------------------------

    @staticmethod
    async def _stop_watching(watcher: asyncio.Task[None] | None) -> None:
        if watcher is not None and not watcher.done():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _end(
        self,
        event: supervisor_pb2.RunEvent,
        state: RunState,
        *,
        report: Report | None = None,
        error: tuple[RunErrorCode, str] | None = None,
    ) -> None:
        values: dict[str, Any] = {
            "state": state.value,
            "usage": self.usage().to_json(),
            "end_time": datetime.now(UTC),
            "report": report.to_json() if report else None,
        }
        if error:
            values["error_code"], values["last_error"] = error[0].value, error[1]
        # The end must be recorded: a database that is briefly away is waited for (bounded), since a run
        # left active would only be ended later, as failed, by the lease sweep.
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Unavailable),
            stop=stop_after_delay(30),
            wait=wait_exponential(multiplier=0.1, max=2),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await self._log.emit(event, terminal=True, values=values)
            log.info("run %s %s%s", self.run_id, state.value, f": {error[1]}" if error else "")
        except RunEnded:
            log.warning("run %s had already been ended elsewhere", self.run_id)

    async def _fail(self, watcher: asyncio.Task[None] | None, code: RunErrorCode, message: str) -> None:
        await self._stop_watching(watcher)
        await self._flush_entries_if_possible()
        await self._end(events.failed(code, message, self.usage()), RunState.FAILED, error=(code, message))

    async def _end_cancelled(self, watcher: asyncio.Task[None] | None) -> None:
        try:
            await self._stop_watching(watcher)
            await self._flush_entries_if_possible()
            await self._end(
                events.cancelled(self.cancel_reason, self.usage()),
                RunState.CANCELLED,
                error=(RunErrorCode.CANCELLED, self.cancel_reason),
            )
        except Exception:
            log.exception("run %s: could not record its cancellation", self.run_id)
