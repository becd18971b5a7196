"""One research run: seed the scratchpad, delegate, re-read, write the report; always one terminal event.

The supervisor runs the same bounded loop as the workers (quarry.agent.loop)
with three tools: delegate_research, read_scratchpad and append_scratchpad.
Its context only ever holds its own turns, short delegation results and
scratchpad reads: worker transcripts stay with the workers. When the research
phase ends (the model is done, the turn bound or the token budget is reached)
the report is written from the verified findings in the scratchpad.

The parts: budget.py (usage and the token budget), delegating.py (orders to
workers and their results), publishing.py (the run's events), tools.py (what the
model may call), synthesis.py (the report). This module only sequences them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from quarry.agent.conversation import ConversationStore
from quarry.agent.loop import AgentRun, LoopLimits, LoopObserver, TurnBudgetExhausted
from quarry.agent.messages import Message, ToolCall, system, user
from quarry.agent.model import ModelClient, ProviderError
from quarry.errors import DatabaseUnavailable, Unavailable
from quarry.identity import Principal, Role
from quarry.recording import SUPERVISOR_SCOPE, Recordings, recording
from quarry.records.fold import fold_ledger
from quarry.records.verification import Verification
from quarry.research_plane import ResearchPlane
from quarry.telemetry import tracer
from quarry.vocabulary import Entry, EntryKind
from supervisor_svc.runs.budget import RunAccount, TokenBudget
from supervisor_svc.runs.delegating import Delegator
from supervisor_svc.runs.domain import (
    DEFAULT_SUPERVISOR_TURNS,
    Approval,
    ApprovalDecision,
    Report,
    ResearchPhase,
    RunErrorCode,
    RunOutcome,
    RunRecord,
)
from supervisor_svc.runs.ledger import LedgerUnwritable, RunLedger
from supervisor_svc.runs.publishing import RunEventLog, RunPublisher
from supervisor_svc.runs.resumption import (
    TAKEN_UP_NOTE,
    DatabaseStayedAway,
    TakenUp,
    TakenUpTooOften,
    awaited_approval,
    read_back,
    time_left,
    wait_for_database,
)
from supervisor_svc.runs.store import RunEnded
from supervisor_svc.runs.synthesis import ResearchEnd, report_warnings, verified_sources, write_report
from supervisor_svc.runs.tools import REGISTRY, SupervisorContext
from supervisor_svc.runs.worker_client import DelegationClient
from supervisor_svc.verification.audits import finding_context
from supervisor_svc.verification.claims import verify_claims
from supervisor_svc.verification.report import with_verification
from supervisor_svc.verification.resolutions import approve_open_objections
from supervisor_svc.verification.review import ReviewDesk, ReviewRequest, ReviewStage, review_report

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "You are the supervisor of a research team. The question is in the scratchpad's seed. Split it into "
    "bounded research tasks and give each to a worker with delegate_research; several calls in one reply run "
    "in parallel. For a question that needs the literature, a scout can first list candidate sources, and an "
    "extractor can take the claims and experiments out of one source; researchers search, read and verify "
    "sources, and promote verified findings to the shared scratchpad. After delegations, read_scratchpad to "
    "see what was promoted, then decide whether more research is needed. You may add notes or markers with "
    "append_scratchpad. When the findings suffice, or further research would not help, reply without calling a "
    "tool: a few lines on what the report should cover. The report is then written from the scratchpad's "
    "verified findings."
)
# How long the end of a run waits out a database that is away: a run left active would only be ended
# later, as failed, by the lease sweep.
_END_RETRY_SECONDS = 30
# How many database outages one run waits out before it gives up.
_MAX_DATABASE_WAITS = 20
# How many open objections the awaiting-approval event names (GetRun's verification lists them all).
_LISTED_OBJECTIONS = 10


class BudgetSpent(Exception):
    """The run's token budget is reached: research stops and the report is written."""


class DatabaseAway(Exception):
    """The run's own database stopped answering: the run waits for it, then goes on from what it recorded."""


class NotApproved(Exception):
    """A run that awaited approval was rejected, or no decision came in time: it fails with `code`."""

    def __init__(self, code: RunErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class RunDependencies:
    model: ModelClient
    conversations: ConversationStore
    scratchpad: ResearchPlane
    delegations: DelegationClient
    default_timeout_seconds: float
    default_parallel: int
    context_tokens: int
    verify_by_default: bool = True  # when RunOptions.verification leaves it to the server
    verification_reserve: float = 0.5  # the share of a verified run's token budget research may not spend
    paper_hosts: frozenset[str] = frozenset()  # hosts whose pages are papers, checked by bibliographic verifiers
    approval_wait_seconds: float = 24 * 3600.0  # how long require_approval waits for a decision
    database_wait_seconds: float = 600.0  # how long a run waits out its database's outage
    # Renews the run's lease for this process; False when another process holds the run now.
    reclaim: Callable[[str], Awaitable[bool]] | None = None
    # Where the run's own HTTP exchanges (its model calls) are recorded for replay; None: not recorded.
    recordings: Recordings | None = None


class _Observer(LoopObserver):
    """Ties the supervisor's loop to the run: the budget before each model call, and its events."""

    def __init__(self, publisher: RunPublisher, budget: TokenBudget, delegator: Delegator) -> None:
        self._publisher = publisher
        self._budget = budget
        self._delegator = delegator

    async def turn_started(self, turn: int, max_turns: int) -> None:
        await self._publisher.reasoning.flush()
        self._delegator.new_turn()
        if self._budget.spent():
            raise BudgetSpent

    async def tool_called(self, turn: int, call: ToolCall) -> None:
        self._delegator.announce(call)

    async def text(self, delta: str) -> None:
        await self._publisher.reasoning.add(delta)


class ResearchRun:
    def __init__(self, record: RunRecord, event_log: RunEventLog, deps: RunDependencies) -> None:
        self.record = record
        self.run_id = record.run_id
        self._deps = deps
        self._timeout = record.options.timeout_seconds or deps.default_timeout_seconds
        self._account = RunAccount()
        self._budget = self._new_budget()
        self._publisher = RunPublisher(event_log, deps.scratchpad, self.run_id, record.scratchpad_thread_id)
        # The run's one ledger: its delegations, the review's resolutions and a person's approval go there.
        self._ledger = RunLedger(deps.scratchpad, self.run_id, record.scratchpad_thread_id)
        self._author = Principal(self.run_id, Role.SUPERVISOR)
        self.cancel_reason = "cancelled"
        self._released = False
        # When set (time.monotonic()), the run's end is recorded by then once it is stopped: the grace
        # of a shutdown, or how long CancelRun waits.
        self.end_by: float | None = None
        # The decision ApproveRun or RejectRun took, delivered by decide() (from this process, or from the
        # store on a lease renewal when another replica took the call).
        self._approval: Approval | None = None
        self._decided = asyncio.Event()
        # The supervisor's conversation as another process recorded it, when this one took the run up.
        self._resumed_history: list[Message] = []
        # Whether the report had begun to stream before this process took the run up.
        self._report_streamed = False

    def _new_budget(self) -> TokenBudget:
        """The run's token budget, with a verified run's reserve for the review held back from research."""
        max_tokens = self.record.options.max_tokens
        reserve = int(max_tokens * self._deps.verification_reserve) if self._verifies else 0
        return TokenBudget(max_tokens, self._account, reserve)

    def releasing(self) -> None:
        """The run is about to be cancelled because this process stops: it records no end, and another
        supervisor process (or this one, restarted) takes it up from what it recorded."""
        self._released = True

    def stopping(self, reason: str, end_within: float | None = None) -> None:
        """The run is about to be cancelled for `reason`; with `end_within`, it records its end within that many
        seconds."""
        self.cancel_reason = reason
        if end_within is not None:
            self.end_by = time.monotonic() + end_within

    async def execute(self, *, resumed: bool = False) -> None:
        """Run to exactly one terminal event (unless the run already ended elsewhere). `resumed`: the run was
        begun by another process, which stopped; it goes on from what that one recorded."""
        attributes = {"quarry.run_id": self.run_id, "quarry.scratchpad_thread_id": self.record.scratchpad_thread_id}
        with (
            tracer.start_as_current_span("research run", attributes=attributes),
            recording(self.run_id, SUPERVISOR_SCOPE, self._deps.recordings),
        ):
            log.info("run %s %s", self.run_id, "taken up again" if resumed else "started")
            note = TAKEN_UP_NOTE
            for _ in range(_MAX_DATABASE_WAITS):
                try:
                    await self._execute(resumed, note)
                    return
                except DatabaseAway:
                    try:
                        record, note = await wait_for_database(
                            self._publisher.store, self.run_id, self._deps.database_wait_seconds, self._deps.reclaim
                        )
                    except DatabaseStayedAway as away:
                        await self._record(self._failed(RunErrorCode.UNAVAILABLE, str(away)))
                        return
                    if record is None:
                        return  # ended, or another process holds the run now
                    self.record, resumed = record, True
            await self._record(self._failed(RunErrorCode.UNAVAILABLE, "the database kept going away; giving up"))

    async def _execute(self, resumed: bool, note: str) -> None:
        timeout = time_left(self.record, self._timeout) if resumed else self._timeout
        deadline = time.monotonic() + timeout
        watcher: asyncio.Task[None] | None = None
        try:
            awaited = awaited_approval(self.record) if resumed else None
            roles_failed = False
            if awaited is not None:  # everything but the decision was done: wait for it again
                report, verification = awaited
                end = ResearchEnd()
            else:
                async with asyncio.timeout(timeout):
                    delegator = await self._take_up(note) if resumed else await self._begin(deadline)
                    watcher = asyncio.create_task(self._publisher.follow_scratchpad())
                    end = await self._research(delegator, resumed=resumed)
                    held = self._budget.reserve
                    self._budget.release_reserve()
                    entries = await self._deps.scratchpad.read_all(self.record.scratchpad_thread_id)
                    verification = await self._verify_claims(entries, delegator) if self._verifies else None
                    reason = _synthesis_reason(end, held)
                    if self._report_streamed:  # a client that joins the text must start over from here
                        reason += "; written again, it replaces the text streamed before this supervisor took over"
                    await self._publisher.status(ResearchPhase.SYNTHESIZING, reason)
                    report, self._account.report = await write_report(
                        self._deps.model, self.record.question, entries, end, self._publisher.content, verification
                    )
                    if verification is not None:
                        report, verification = await self._review(report, entries, verification, delegator)
                    roles_failed = delegator.roles_cannot_follow_contracts()
            warnings = report_warnings(
                report, end, self._account.usage().total, verification, roles_failed=roles_failed
            )
            if self.record.options.require_approval:  # after the run's time limit: a person may take longer
                verification = await self._await_approval(report, verification, announce=awaited is None)
            if verification is not None:  # the final report states how each claim was verified
                report = with_verification(report, verification)
            outcome = RunOutcome.succeeded(report, self._account.usage(), warnings, verification)
        except NotApproved as refusal:
            outcome = self._failed(refusal.code, refusal.message)
        except asyncio.CancelledError:
            if self._released:  # it goes on elsewhere: nothing ends here
                if watcher is not None:
                    watcher.cancel()
                raise
            cancelled = RunOutcome.cancelled(self.cancel_reason, self._account.usage())
            await asyncio.shield(self._quietly(self._end(watcher, cancelled)))
            raise
        except ProviderError as error:
            outcome = self._failed(RunErrorCode.PROVIDER_ERROR, str(error))
        except LedgerUnwritable as error:  # the scratchpad would not take what the verification rests on
            outcome = self._failed(RunErrorCode.UNAVAILABLE, str(error))
        except TakenUpTooOften as error:
            outcome = self._failed(RunErrorCode.INTERNAL, str(error))
        except TimeoutError:
            outcome = self._failed(RunErrorCode.DEADLINE_EXCEEDED, f"the run ran past its {self._timeout:g} s limit")
        except Exception as error:
            if isinstance(error, DatabaseUnavailable) and self._deps.database_wait_seconds:
                if watcher is not None:
                    watcher.cancel()
                raise DatabaseAway from error  # waited out in execute(), then the run goes on
            log.exception("run %s failed", self.run_id)
            outcome = self._failed(RunErrorCode.INTERNAL, f"the supervisor failed: {type(error).__name__}: {error}")
        try:
            await self._end(watcher, outcome)
        except asyncio.CancelledError:  # stopped while ending: the outcome stands, recorded without the scratchpad
            await asyncio.shield(self._quietly(self._record(outcome)))
            raise

    async def _begin(self, deadline: float) -> Delegator:
        await self._publisher.started()
        await self._seed()
        return self._delegator(deadline)

    async def _take_up(self, note: str) -> Delegator:
        """A run another process began (or this one, before its database went away): the account, the
        delegation ids and the published entries as it left them (supervisor_svc.runs.resumption); `note`
        says why, on the run's events."""
        await self._seed()  # idempotent: a run that stopped before its seed gets it now
        conversation_id = _conversation_id(self.run_id)
        found = await read_back(
            self.record, self._publisher.store, self._deps.scratchpad, self._deps.conversations, conversation_id
        )
        self._publisher.resume_after(found.published.last_entry)
        self._report_streamed = found.published.report_streamed
        self._resumed_history = found.history
        self._account = RunAccount()
        self._budget = self._new_budget()
        workers, verification = found.prior.usage()
        self._account.carry(self.record.usage.supervisor, workers, verification)
        ordered = len(found.prior.ordered)
        await self._publisher.status(ResearchPhase.STARTED, f"{note}; {ordered} delegation(s) were ordered before")
        return self._delegator(time.monotonic() + time_left(self.record, self._timeout), found)

    async def _seed(self) -> None:
        thread_id = self.record.scratchpad_thread_id
        await self._deps.scratchpad.create_thread(
            thread_id, title=self.record.question[:200], request_id=f"{self.run_id}/thread"
        )
        await self._deps.scratchpad.append(
            thread_id,
            kind=EntryKind.SEED,
            author=self._author,
            content=f"Research question: {self.record.question}",
            request_id=f"{self.run_id}/seed",
        )

    def _delegator(self, deadline: float, taken_up: TakenUp | None = None) -> Delegator:
        """The run's one delegation desk: the researchers' delegations and the evidence roles' share it;
        `taken_up` goes on with the delegations of a run another process began."""
        options = self.record.options
        return Delegator(
            earlier=taken_up.earlier_orders() if taken_up is not None else None,
            run_id=self.run_id,
            thread_id=self.record.scratchpad_thread_id,
            max_worker_turns=options.max_worker_turns,
            parallel=options.max_parallel_delegations or self._deps.default_parallel,
            deadline=deadline,
            client=self._deps.delegations,
            scratchpad=self._deps.scratchpad,
            account=self._account,
            budget=self._budget,
            publisher=self._publisher,
            ledger=self._ledger,
            tiers={role: tier for role in Role if (tier := options.tier_for(role)) is not None},
        )

    async def _research(self, delegator: Delegator, *, resumed: bool) -> ResearchEnd:
        """The supervisor's loop, until it answers or a bound stops it; taken up, from its recorded turns."""
        options = self.record.options
        conversation_id = _conversation_id(self.run_id)
        history = self._resumed_history
        if not history:
            await self._publisher.status(ResearchPhase.PLANNING, "planning the research")
            history = [
                system(INSTRUCTIONS),
                user(
                    f"Research question: {self.record.question}\n\nThe scratchpad holds the seed as entry 1. "
                    "Plan, delegate, and check the findings."
                ),
            ]
            await self._deps.conversations.create(conversation_id, history)
        context = SupervisorContext(
            delegations=delegator,
            scratchpad=self._deps.scratchpad,
            scratchpad_thread_id=self.record.scratchpad_thread_id,
            author=self._author,
        )
        limits = LoopLimits(
            max_turns=options.max_supervisor_turns or DEFAULT_SUPERVISOR_TURNS,
            context_tokens=self._deps.context_tokens,
        )
        observer = _Observer(self._publisher, self._budget, delegator)
        agent = AgentRun(
            self._deps.model, REGISTRY, self._deps.conversations, conversation_id, limits, observer, agent="supervisor"
        )
        self._account.count_planning(lambda: agent.usage)
        end = ResearchEnd()
        try:
            end = ResearchEnd(notes=await _answer_of(agent, context, history))
        except TurnBudgetExhausted:
            end = ResearchEnd(turn_budget_exhausted=True)
        except BudgetSpent:
            end = ResearchEnd(token_budget_exhausted=True)
        await self._publisher.reasoning.flush()
        return replace(end, delegations=delegator.dispatched)

    # -- verification ------------------------------------------------------------------------

    @property
    def _verifies(self) -> bool:
        return self.record.options.verifies(self._deps.verify_by_default)

    async def _verify_claims(self, entries: Sequence[Entry], delegator: Delegator) -> Verification:
        """A blind claim-verifier for every finding the report may cite; GetRun shows their verdicts."""

        async def progress(message: str) -> None:
            await self._publisher.status(ResearchPhase.VERIFYING_CLAIMS, message)

        await verify_claims(
            self.record.question, entries, delegator, self._ledger, progress, paper_hosts=self._deps.paper_hosts
        )
        verification = await self._folded()
        await self._publisher.verification(ResearchPhase.VERIFYING_CLAIMS, _claims_summary(verification), verification)
        return verification

    async def _folded(self) -> Verification:
        """The run's verification as its ledger holds it, which is what GetRun serves (quarry.records.fold)."""
        return fold_ledger(await self._deps.scratchpad.read_all(self.record.scratchpad_thread_id))

    async def _review(
        self, draft: Report, entries: Sequence[Entry], verification: Verification, delegator: Delegator
    ) -> tuple[Report, Verification]:
        """Audit the draft's cited sentences and settle every objection, but for those a person is to decide
        (the run awaits approval): the reviewed report, before its verification sections."""

        async def status(stage: ReviewStage, message: str) -> None:
            await self._publisher.status(ResearchPhase(stage.value), message)

        citable = verification.citable_findings()
        request = ReviewRequest(
            question=self.record.question,
            draft=draft,
            sources=verified_sources(entries, verification),
            claims={entry.sequence_no: entry.content for entry in entries if entry.sequence_no in citable},
            context=finding_context(verification),
            contested=verification.contested(),
            max_revision_rounds=self.record.options.revision_rounds,
            leave_unsettled_open=self.record.options.require_approval,
        )
        desk = ReviewDesk(self.run_id, delegator, self._ledger, self._deps.model, self._budget, status)
        reviewed = await review_report(request, desk)
        verification = await self._folded()
        await self._publisher.verification(ResearchPhase.AUDITING, _review_summary(verification), verification)
        return reviewed.report, verification

    # -- approval ----------------------------------------------------------------------------

    def decide(self, approval: Approval) -> None:
        """ApproveRun's or RejectRun's decision; the first one delivered stands."""
        if self._approval is None:
            self._approval = approval
            self._decided.set()

    async def _await_approval(
        self, report: Report, verification: Verification | None, *, announce: bool = True
    ) -> Verification | None:
        """Wait in AWAITING_APPROVAL for a person's decision on the finished run. Approved: the verification
        with the objections still open resolved as approved over (ApproveRun allows that only when asked to).
        NotApproved when rejected (REJECTED; the objections stay open in the stored state) or when no decision
        comes in time
        (DEADLINE_EXCEEDED). CancelRun still ends it. GetRun shows the report the person decides on."""
        wait = self._deps.approval_wait_seconds
        if announce:  # else it was announced (and stored) by the process that began the run
            pending = report if verification is None else with_verification(report, verification)
            await self._publisher.awaiting_approval(_approval_message(verification, wait), pending, verification)
        elif self.record.approval is not None:  # decided while no process was running it
            self.decide(self.record.approval)
        try:
            async with asyncio.timeout(wait):
                await self._decided.wait()
        except TimeoutError:
            raise NotApproved(
                RunErrorCode.DEADLINE_EXCEEDED, f"no one approved or rejected the run within {wait:g} s"
            ) from None
        assert self._approval is not None
        if self._approval.decision is ApprovalDecision.REJECTED:
            raise NotApproved(RunErrorCode.REJECTED, self._approval.note)
        if verification is not None:
            await approve_open_objections(verification, self._approval.note, self._approval.decided_by, self._ledger)
            verification = await self._folded()
        await self._note_approval(self._approval.note, self._approval.decided_by)
        return verification

    async def _note_approval(self, comment: str, approver: str) -> None:
        """The approval, with the approver's comment, as a NOTE on the run's ledger. The run's row keeps the
        comment too, so a scratchpad that is away only costs the ledger its note."""
        try:
            await self._deps.scratchpad.append(
                self.record.scratchpad_thread_id,
                kind=EntryKind.NOTE,
                author=self._author,
                content=f"Approved by {approver or 'a person'}{f': {comment}' if comment else '.'}",
                request_id=f"{self.run_id}/approval",
            )
        except Exception as error:
            log.warning("run %s: could not note its approval on the scratchpad: %s", self.run_id, error)

    # -- endings ----------------------------------------------------------------------------

    async def _end(self, watcher: asyncio.Task[None] | None, outcome: RunOutcome) -> None:
        """Stop the live entry updates, report the entries they missed, then record the one ending.

        With `end_by` set the ending is recorded by then, whatever the scratchpad does: the missed
        entries get at most half the time left and are given up after it.
        """
        if watcher is not None and not watcher.done():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        left = self._seconds_left()
        await self._publisher.catch_up(within=None if left is None else left / 2)
        await self._record(outcome)

    async def _record(self, outcome: RunOutcome) -> None:
        """The terminal event and the run's final columns, retried while the database is away (until
        `end_by`, when set)."""
        left = self._seconds_left()
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Unavailable),
            stop=stop_after_delay(_END_RETRY_SECONDS if left is None else left),
            wait=wait_exponential(multiplier=0.1, max=2),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await self._publisher.finish(outcome)
            log.info("run %s %s%s", self.run_id, outcome.state.value, f": {outcome.message}" if outcome.message else "")
        except RunEnded:
            log.warning("run %s had already been ended elsewhere", self.run_id)

    async def _quietly(self, ending: Awaitable[None]) -> None:
        """An ending under a stop: a failure to record it is logged, and the task ends cancelled."""
        try:
            await ending
        except Exception:
            log.exception("run %s: could not record its end", self.run_id)

    def _seconds_left(self) -> float | None:
        return None if self.end_by is None else max(self.end_by - time.monotonic(), 0.0)

    def _failed(self, code: RunErrorCode, message: str) -> RunOutcome:
        return RunOutcome.failed(code, message, self._account.usage())


def _conversation_id(run_id: str) -> str:
    return f"sup-{run_id}"


async def _answer_of(agent: AgentRun[SupervisorContext], context: SupervisorContext, history: list[Message]) -> str:
    """The loop's answer; a taken-up run whose recorded last turn already answered is not asked again."""
    last = history[-1]
    if last.role == "assistant" and not last.tool_calls:
        return last.content
    return await agent.run(context, history=history)


def _claims_summary(verification: Verification) -> str:
    judged = Counter(check.judgement.value if check.judgement else "unverified" for check in verification.findings)
    counts = ", ".join(f"{count} {judgement}" for judgement, count in sorted(judged.items())) or "no finding to verify"
    return f"claims verified: {counts}"


def _review_summary(verification: Verification) -> str:
    return (
        f"report reviewed: {verification.supported_claims} supported, {verification.removed_claims} removed, "
        f"{verification.contested_claims} contested; {verification.revision_rounds} revision round(s)"
    )


def _approval_message(verification: Verification | None, wait_seconds: float) -> str:
    opening = f"awaiting approval (ApproveRun or RejectRun, within {wait_seconds:g} s)"
    still_open = verification.open_objections if verification is not None else ()
    if not still_open:
        return f"{opening}; no objection is open"
    listed = "; ".join(f"sentence {o.sentence_index}: {o.reason[:200]}" for o in still_open[:_LISTED_OBJECTIONS])
    more = f"; and {len(still_open) - _LISTED_OBJECTIONS} more" if len(still_open) > _LISTED_OBJECTIONS else ""
    return f"{opening}; {len(still_open)} objection(s) still open: {listed}{more}"


def _synthesis_reason(end: ResearchEnd, held: int) -> str:
    if end.token_budget_exhausted and held:
        return (
            f"research's share of the token budget is spent ({held} tokens are held back for verification); "
            "writing the report from what exists"
        )
    if end.token_budget_exhausted:
        return "the token budget is spent; writing the report from what exists"
    if end.turn_budget_exhausted:
        return "the turn bound is reached; writing the report from what exists"
    return "writing the report"
