"""THINK: a leader conversation on the shared agent kernel that lives for one cycle and chooses one hypothesis.

The leader reads what the memory gives it, may have a researcher read the literature first, and hands
the change to an engineer worker; it may record an insight or a dead end. Its answer is the
hypothesis; the loop commits whatever the engineer changed and runs it.

Its delegations go through the run's delegation desk (supervisor_svc.delegating.Delegator), one per
THINK: each leaves its assignment, route and usage entries on the campaign's thread, as a run's do,
and at most `parallel_delegations` run at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, Field

from quarry.agent.conversation import ConversationStore
from quarry.agent.loop import AgentRun, LoopLimits, LoopObserver
from quarry.agent.messages import system, user
from quarry.agent.model import ModelClient
from quarry.agent.tools import Tool, ToolError, ToolRegistry, current_call
from quarry.identity import Role
from quarry.literature import PAPER_ANALYSIS_CRITERIA, full_text_url, paper_analysis
from quarry.records.campaign import DeadEnd, Insight, InsightSource
from quarry.records.research import ExtractedEvidence
from quarry.research_plane import ResearchPlane
from quarry.vocabulary import DelegationResult, Entry, EntryKind
from supervisor_svc.campaigns.memory import ThinkBriefing
from supervisor_svc.campaigns.thread import CampaignThread
from supervisor_svc.runs.budget import RunAccount, TokenBudget
from supervisor_svc.runs.delegating import Contract, Delegator
from supervisor_svc.runs.domain import ResearchPhase, RunUsage
from supervisor_svc.runs.ledger import RunLedger
from supervisor_svc.runs.tools import Criterion
from supervisor_svc.runs.worker_client import DelegationClient

INSTRUCTIONS = """You lead one cycle of an experiment campaign on a code workspace.
Read the brief, the memory, the signals and the recent experiments, then choose ONE hypothesis: a
single change that could improve the metric. Never retry a dead end. Follow the human's directives.
Have an engineer make the change with delegate_engineer (it edits the workspace; it must not run the
full experiment: the campaign runs it after you). Before choosing, you may have a researcher look
something up in the literature with delegate_research (a researcher can list new papers, a paper's
citations and a venue's papers), or have a paper analysed with analyze_paper. You may record an
insight or a dead end.
End with a short answer that states the hypothesis, and nothing else."""


@dataclass(frozen=True)
class ThinkSettings:
    # How long a THINK may take (turns) and an engineer or research delegation may run.
    think_turns: int = 8
    engineer_turns: int = 0  # 0: the worker's default
    engineer_timeout_seconds: float = 900.0
    research_turns: int = 0  # 0: the worker's default
    research_timeout_seconds: float = 900.0
    # Delegations one THINK may have in flight.
    parallel_delegations: int = 4


@dataclass(frozen=True)
class Thought:
    """What one THINK came to."""

    hypothesis: str
    changes: tuple[str, ...]  # what the engineer was asked to change, in order
    files: tuple[str, ...]  # what it changed, sorted
    tokens: int  # the leader's and its delegations'
    failure: str = ""  # why nothing can run ("" when the change is ready)


# -- THINK's tools -----------------------------------------------------------------------------------


class EngineerParams(BaseModel):
    change: str = Field(min_length=1, max_length=4000, description="the change to make, self-contained")


class ResearchParams(BaseModel):
    objective: str = Field(min_length=1, max_length=4000, description="the research task, self-contained")
    criteria: list[Criterion] = Field(default_factory=list, max_length=10, description="what a good answer must show")


class PaperParams(BaseModel):
    paper: str = Field(
        min_length=1, max_length=500, description="an arXiv id or URL, a DOI, or the URL of the paper's full text"
    )
    focus: str = Field(default="", max_length=1000, description="what the campaign wants from the paper")


class NoteParams(BaseModel):
    text: str = Field(min_length=1, max_length=1000)


class InsightParams(BaseModel):
    text: str = Field(min_length=1, max_length=1000)
    cites: list[int] = Field(
        default_factory=list,
        max_length=20,
        description="the findings (scratchpad entry numbers) this cycle's literature research promoted that the "
        "insight rests on",
    )


class DeadEndParams(BaseModel):
    approach: str = Field(min_length=1, max_length=1000)
    reason: str = Field(min_length=1, max_length=1000)


@dataclass
class ThinkSession:
    """One THINK's state, as its tools see it: what it delegated and changed, and what that cost."""

    thinker: Thinker
    cycle: int
    workspace_id: str
    desk: Delegator  # this THINK's: a THINK redone after a restart delegates under new ids
    account: RunAccount  # the cycle's usage: THINK's model calls and its delegations'
    budget: TokenBudget  # what the cycle may spend (max_tokens 0: no bound)
    changes: list[str] = field(default_factory=list)
    files: set[str] = field(default_factory=set)
    promoted: set[int] = field(default_factory=set)  # the entries its research delegations promoted


async def delegate_engineer(params: EngineerParams, session: ThinkSession) -> str:
    return await session.thinker.engineer(params.change, session)


async def delegate_research(params: ResearchParams, session: ThinkSession) -> str:
    return await session.thinker.research(params.objective, tuple(params.criteria), session)


async def analyze_paper(params: PaperParams, session: ThinkSession) -> str:
    try:
        url = full_text_url(params.paper)
    except ValueError as error:
        raise ToolError(str(error)) from error
    return await session.thinker.analyze_paper(url, params.focus, session)


async def record_insight(params: InsightParams, session: ThinkSession) -> str:
    """An insight, with the findings it cites copied in (their pages and quotes): only findings this THINK's
    research promoted, each a finding on the campaign's thread."""
    unknown = sorted(set(params.cites) - session.promoted)
    if unknown:
        promoted = ", ".join(map(str, sorted(session.promoted))) or "none"
        raise ToolError(
            f"cite only findings this cycle's research promoted ({promoted}); not {', '.join(map(str, unknown))}"
        )
    findings = await session.thinker.findings(set(params.cites))
    sources = tuple(
        InsightSource(finding_ref=n, url=source.url, excerpt=source.excerpt)
        for n in params.cites
        if n in findings
        for source in findings[n].sources[:1]
    )
    await session.thinker.thread.write(
        Insight(cycle=session.cycle, text=params.text, sources=sources), f"insight/{current_call().id}"
    )
    return f"recorded, citing {len(sources)} finding(s)" if sources else "recorded"


async def record_dead_end(params: DeadEndParams, session: ThinkSession) -> str:
    entry = DeadEnd(cycle=session.cycle, approach=params.approach, reason=params.reason)
    await session.thinker.thread.write(entry, f"dead-end/{current_call().id}")
    return "recorded"


THINK_TOOLS: ToolRegistry[ThinkSession] = ToolRegistry(
    [
        Tool(
            "delegate_engineer",
            "Have an engineer make the change in the workspace (on the campaign's branch); returns what it did.",
            EngineerParams,
            delegate_engineer,
        ),
        Tool(
            "delegate_research",
            "Have a researcher look something up in the literature; returns its summary and how many findings "
            "it promoted to the campaign's thread.",
            ResearchParams,
            delegate_research,
        ),
        Tool(
            "analyze_paper",
            "Have an extractor read a paper whole and take out its problem, method, results with their numbers, "
            "and limitations, each quoted with where it is; returns them.",
            PaperParams,
            analyze_paper,
        ),
        Tool(
            "record_insight",
            "Keep a durable observation in the campaign's insights, citing the findings of this cycle's research "
            "it rests on.",
            InsightParams,
            record_insight,
        ),
        Tool(
            "record_dead_end", "Record an approach that failed, so it is never retried.", DeadEndParams, record_dead_end
        ),
    ]
)


class CycleBudgetSpent(Exception):
    """The next model call would cross what the cycle may spend: THINK stops before making it."""


class _CycleBudget(LoopObserver):
    """Before each THINK turn: stop when the cycle's tokens so far, plus what one call has cost on average,
    would cross what the cycle may spend (its delegations' tokens count too)."""

    def __init__(self, budget: TokenBudget) -> None:
        self._budget = budget

    async def turn_started(self, turn: int, max_turns: int) -> None:
        left = self._budget.left()
        if left is not None and left - self._budget.one_call() < 0:
            spent = self._budget.account.usage().total.tokens
            raise CycleBudgetSpent(
                f"stopped before a model call that would cross the campaign's token budget: {spent} of the "
                f"{self._budget.max_tokens} tokens this cycle could spend are used, and a call costs about "
                f"{self._budget.one_call()}"
            )


class Thinking(Protocol):
    async def think(
        self, cycle: int, attempt: str, briefing: ThinkBriefing, workspace_id: str, tokens_left: int | None = None
    ) -> Thought:
        """One THINK of `cycle`, `attempt` its conversation's id; the engineer edits the workspace `workspace_id`."""
        ...


# -- the leader --------------------------------------------------------------------------------------


class Thinker:
    """The campaign's THINKs, one per cycle, each a conversation of its own."""

    def __init__(
        self,
        campaign_id: str,
        thread: CampaignThread,
        scratchpad: ResearchPlane,
        model: ModelClient,
        conversations: ConversationStore,
        delegations: DelegationClient,
        settings: ThinkSettings,
    ) -> None:
        self._campaign_id = campaign_id
        self.thread = thread
        self._scratchpad = scratchpad
        self._model = model
        self._conversations = conversations
        self._delegations = delegations
        self._settings = settings

    async def think(
        self, cycle: int, attempt: str, briefing: ThinkBriefing, workspace_id: str, tokens_left: int | None = None
    ) -> Thought:
        """One THINK; `tokens_left`: what the cycle may spend (its model calls and its delegations'), None for no
        bound. It stops before a call that would cross it, and its delegations share what is left."""
        session = self.session(cycle, attempt, workspace_id, tokens_left or 0)
        opening = [system(INSTRUCTIONS), user(briefing.render())]
        await self._conversations.create(attempt, opening)
        agent = AgentRun(
            self._model,
            THINK_TOOLS,
            self._conversations,
            attempt,
            LoopLimits(max_turns=self._settings.think_turns),
            _CycleBudget(session.budget),
            agent="campaign",
        )
        session.account.count_planning(lambda: agent.usage)
        failure = ""
        hypothesis = ""
        try:
            hypothesis = (await agent.run(session, history=list(opening))).strip()
        except CycleBudgetSpent as spent:
            failure = str(spent)
        except Exception as error:  # the model failed: the cycle failed, the limiter backs off
            failure = f"THINK failed: {error}"
        return Thought(
            hypothesis=hypothesis or "(no hypothesis stated)",
            changes=tuple(session.changes),
            files=tuple(sorted(session.files)),
            tokens=session.account.usage().total.tokens,
            failure=failure,
        )

    def session(self, cycle: int, attempt: str, workspace_id: str, max_tokens: int = 0) -> ThinkSession:
        """A THINK's state, with its own delegation desk and the account of the cycle's usage (THINK's model
        calls and its delegations'): `max_tokens` bounds them together (0: no bound), and each delegation gets a
        share of what is left."""
        account = RunAccount()
        budget = TokenBudget(max_tokens, account)
        desk = campaign_desk(
            CampaignDesk(self._campaign_id, self.thread.thread_id, self._scratchpad, self._delegations),
            attempt,
            self._settings.parallel_delegations,
            account,
            budget,
        )
        return ThinkSession(self, cycle, workspace_id, desk, account, budget)

    async def engineer(self, change: str, session: ThinkSession) -> str:
        """One engineer delegation in the campaign's workspace; what it did, for the leader."""
        settings = self._settings
        contract = Contract(
            Role.ENGINEER,
            change,
            ("edit the workspace only; do not run the full experiment",),
            workspace_id=session.workspace_id,
            max_turns=settings.engineer_turns,
            timeout_seconds=settings.engineer_timeout_seconds,
        )
        result = await _delegate(session, contract)
        session.changes.append(change)
        session.files.update(result.files_changed)
        if not result.succeeded:
            return f"the engineer failed: {result.error_message}"
        files = ", ".join(result.files_changed) or "none"
        return f"done; files changed: {files}\n{result.summary}"

    async def findings(self, numbers: set[int]) -> dict[int, Entry]:
        """The findings among entries `numbers` of the campaign's thread, by number."""
        if not numbers:
            return {}
        entries = await self._scratchpad.read_all(self.thread.thread_id, after_sequence_no=min(numbers) - 1)
        return {e.sequence_no: e for e in entries if e.sequence_no in numbers and e.kind is EntryKind.FINDING}

    async def research(self, objective: str, criteria: tuple[str, ...], session: ThinkSession) -> str:
        """One literature research delegation (its findings promoted to the campaign's thread); its summary."""
        settings = self._settings
        contract = Contract(
            Role.RESEARCHER,
            objective,
            criteria,
            max_turns=settings.research_turns,
            timeout_seconds=settings.research_timeout_seconds,
        )
        result = await _delegate(session, contract)
        session.promoted.update(result.promoted)
        if not result.succeeded:
            return f"the researcher failed: {result.error_message}"
        entries = f" (entries {', '.join(map(str, sorted(result.promoted)))}; record_insight cites the findings)"
        return f"done; findings promoted: {len(result.promoted)}{entries if result.promoted else ''}\n{result.summary}"

    async def analyze_paper(self, url: str, focus: str, session: ThinkSession) -> str:
        """One extractor delegation on the paper's full text (its records promoted as evidence); its records."""
        settings = self._settings
        contract = Contract(
            Role.EXTRACTOR,
            paper_analysis(url, focus),
            PAPER_ANALYSIS_CRITERIA,
            input_refs=(url,),
            max_turns=settings.research_turns,
            timeout_seconds=settings.research_timeout_seconds,
        )
        result = await _delegate(session, contract)
        if not result.succeeded:
            return f"the extractor failed: {result.error_message}"
        evidence = ExtractedEvidence.parse(result.output_json)
        assert isinstance(evidence, ExtractedEvidence)  # an extractor's output is nothing else
        lines = [
            f'- {record.kind.value}: {record.statement} ({record.location}: "{record.quote}")'
            for record in evidence.records
        ]
        return "\n".join([f"{url}, recorded as entry {result.output_sequence_no}:", *lines])


async def _delegate(session: ThinkSession, contract: Contract) -> DelegationResult:
    """One worker delegation on the campaign's thread, keyed by the leader's tool call."""
    result = await session.desk.assign(contract, current_call().id)
    if result is None:  # the desk's budget is unbounded: it never refuses
        raise AssertionError("a campaign's delegation desk refused a delegation")
    return result


@dataclass(frozen=True)
class CampaignDesk:
    """Where a campaign's delegations go: its thread (their entries and their ledger), the workers."""

    campaign_id: str
    thread_id: str
    scratchpad: ResearchPlane
    delegations: DelegationClient


def campaign_desk(
    where: CampaignDesk, run_id: str, parallel: int, account: RunAccount, budget: TokenBudget
) -> Delegator:
    """A delegation desk on the campaign's thread, for one THINK or one report (`run_id` names it)."""
    return Delegator(
        run_id=run_id,
        thread_id=where.thread_id,
        max_worker_turns=0,  # each contract says
        parallel=parallel,
        deadline=math.inf,  # each contract has its own time limit
        client=where.delegations,
        scratchpad=where.scratchpad,
        account=account,
        budget=budget,
        publisher=_UNANNOUNCED,
        ledger=RunLedger(where.scratchpad, where.campaign_id, where.thread_id),
    )


class _Unannounced:
    """A campaign's delegations are not events of its own: their entries on the thread are its record."""

    async def status(self, phase: ResearchPhase, message: str, *, delegation_id: str = "", worker_id: str = "") -> None:
        return None

    async def delegation_ended(self, result: DelegationResult, usage: RunUsage) -> None:
        return None


_UNANNOUNCED = _Unannounced()
