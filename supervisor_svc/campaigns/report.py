"""The campaign's written report: the writer's prose over the ledger's facts, every figure checked by code.

The writer (a ROLE_WRITER worker, no tools) is given the brief and the ledger as facts, each figure with the
citation it must be written as: "c14: val_loss 0.231" (a cycle's result), "baseline: val_loss 4.0012" (the
baseline's mean), "noise: val_loss 0.0021" (the noise floor), "best: val_loss 0.231" (the kept state). The
figure check (`check_figures`, pure) refuses a draft with a citation the ledger does not back at the precision
written, or a decimal figure that is neither cited nor in the ledger's own text (a hypothesis's "lr 0.1" is).
A refused draft gets one repair; refused again, the report is the ledger's facts without the prose, and says why.
The ledger table is code's, never the writer's.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from quarry import ids
from quarry.errors import NotFound, QuarryError
from quarry.identity import Role
from quarry.records.campaign import CampaignRecord, CampaignReport, DeadEnd, Insight, TrialRecord
from quarry.records.signals import Signals, read_signals
from quarry.research_plane import ResearchPlane
from quarry.vocabulary import MetricDirection
from supervisor_svc.campaigns.memory import clip_line
from supervisor_svc.campaigns.service import Campaigns
from supervisor_svc.campaigns.spec import CampaignSpec
from supervisor_svc.campaigns.state import CampaignRecord as StoredCampaign
from supervisor_svc.campaigns.state import CampaignState
from supervisor_svc.campaigns.think import CampaignDesk, campaign_desk
from supervisor_svc.campaigns.thread import CampaignThread
from supervisor_svc.runs.budget import RunAccount, TokenBudget
from supervisor_svc.runs.delegating import Contract, Delegator
from supervisor_svc.runs.worker_client import DelegationClient

log = logging.getLogger(__name__)

# The writer's task (the objective) fits a worker's limit of 16,000 characters; its answer is cut to this.
_MAX_FACTS_CHARS = 14_000
_MAX_REPORT_CHARS = 32_000
_TEXT_CHARS = 160  # of a hypothesis, dead end or insight, in the facts and the table
_WRITER_TURNS = 2
_WRITER_TIMEOUT_SECONDS = 600.0

_NUMBER = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
# "c14: val_loss 0.231", "baseline: val_loss 4.0", "noise: val_loss=0.002" (a colon, then the metric and value).
_CITATION = re.compile(rf"\b(c\d+|baseline|noise|best)\s*:\s*([A-Za-z_][\w.\-/]*)\s*[= ]\s*({_NUMBER})")
# A decimal figure (a point or an exponent), not part of a version string, an identifier or a longer number.
_DECIMAL = re.compile(r"(?<![\w.])[-+]?\d*\.\d+(?:[eE][-+]?\d+)?(?!\.?\d|\w)|(?<![\w.])\d+[eE][-+]?\d+(?!\w)")


@dataclass(frozen=True)
class ReportFacts:
    """What the report may say, from the campaign's spec, records and signals."""

    title: str
    goal: str
    metric: str
    better: str  # "lower" or "higher"
    trials: tuple[TrialRecord, ...]
    dead_ends: tuple[DeadEnd, ...]
    insights: tuple[Insight, ...]
    figures: dict[str, float]  # citation label ("c14", "baseline", ...) -> the metric's value

    @classmethod
    def of(cls, spec: CampaignSpec, records: Sequence[CampaignRecord], signals: Signals) -> ReportFacts:
        metric = spec.metric.name
        trials = tuple(r for r in records if isinstance(r, TrialRecord))
        figures: dict[str, float] = {}
        for trial in trials:
            value = trial.metrics.get(metric)
            if value is not None:
                figures[f"c{trial.cycle}"] = value
        if signals.noise is not None:
            figures["baseline"] = signals.noise.mean
            figures["noise"] = signals.noise.floor
        if signals.best is not None:
            figures["best"] = signals.best
        return cls(
            title=spec.title or spec.brief.goal[:80],
            goal=spec.brief.goal,
            metric=metric,
            better="lower" if signals.goal.direction is MetricDirection.MINIMIZE else "higher",
            trials=trials,
            dead_ends=tuple(r for r in records if isinstance(r, DeadEnd)),
            insights=tuple(r for r in records if isinstance(r, Insight)),
            figures=figures,
        )

    @property
    def ledger_text(self) -> str:
        """Every word of the ledger a report may repeat (a hypothesis's own figures are the ledger's)."""
        parts = [self.goal]
        for trial in self.trials:
            parts += [trial.hypothesis, trial.action, trial.conclusion]
        parts += [f"{d.approach} {d.reason}" for d in self.dead_ends]
        parts += [i.text for i in self.insights]
        return "\n".join(parts)

    def cite(self, label: str) -> str:
        return f"{label}: {self.metric} {self.figures[label]:.6g}"


def writer_task(facts: ReportFacts) -> str:
    """The writer's objective: the brief and the ledger, each figure as the citation to write."""
    head = [
        f"Write the report of the campaign {facts.title!r}.",
        f"Goal: {facts.goal}",
        f"Metric: {facts.metric} ({facts.better} is better).",
    ]
    head += [f"- {facts.cite(label)}" for label in ("baseline", "noise", "best") if label in facts.figures]
    head.append("Ledger (cycle, verdict, result, hypothesis):")
    rows = [_fact_row(facts, trial) for trial in facts.trials]
    tail = [f"Dead end after c{d.cycle}: {_short(d.approach)}: {_short(d.reason)}" for d in facts.dead_ends]
    tail += [f"Insight in c{i.cycle}: {_short(i.text)}" for i in facts.insights]
    # A long campaign keeps its first rows (the baseline) and its latest; the middle is summarised.
    budget = _MAX_FACTS_CHARS - sum(len(line) + 1 for line in (*head, *tail))
    kept = _fit(rows, budget)
    return "\n".join((*head, *kept, *tail))


def check_figures(text: str, facts: ReportFacts) -> list[str]:
    """What is wrong with the figures of a draft: citations the ledger does not back, figures from nowhere."""
    problems: list[str] = []
    cited_spans: list[tuple[int, int]] = []
    for match in _CITATION.finditer(text):
        label, metric, written = match.group(1), match.group(2), match.group(3)
        cited_spans.append(match.span())
        if metric != facts.metric:
            problems.append(f"{match.group(0)!r}: the campaign's metric is {facts.metric}")
        elif label not in facts.figures:
            problems.append(f"{match.group(0)!r}: the ledger has no {facts.metric} for {label}")
        elif not _agrees(written, facts.figures[label]):
            problems.append(f"{match.group(0)!r}: the ledger says {facts.cite(label)}")
    allowed = {_canonical(m.group(0)) for m in _DECIMAL.finditer(facts.ledger_text)}
    for match in _DECIMAL.finditer(text):
        inside = any(start <= match.start() < end for start, end in cited_spans)
        if not inside and _canonical(match.group(0)) not in allowed:
            problems.append(
                f"{match.group(0)!r} cites no cycle and is not in the ledger: write a figure as its citation "
                f"('c14: {facts.metric} 0.231'), and no figure of your own"
            )
    return problems


@dataclass(frozen=True)
class Draft:
    text: str
    tokens: int
    failure: str = ""  # the writer's delegation failed


class Writer:
    """Writes one report through a delegation desk of its own (the campaign's thread and ledger)."""

    def __init__(self, desk: Delegator) -> None:
        self._desk = desk

    async def write(self, facts: ReportFacts, request_id: str) -> CampaignReport:
        task = writer_task(facts)
        draft = await self._draft(task, "report-draft")
        tokens = draft.tokens
        problems = [f"the writer failed: {draft.failure}"] if draft.failure else check_figures(draft.text, facts)
        if problems and not draft.failure:
            repair = (
                f"{task}\n\nYour draft below was refused: {'; '.join(problems[:20])}.\nRewrite it with every "
                f"figure written as its citation from the ledger above.\n\n--- your draft ---\n{draft.text}"
            )
            draft = await self._draft(repair[:15_500], "report-repair")
            tokens += draft.tokens
            problems = [f"the writer failed: {draft.failure}"] if draft.failure else check_figures(draft.text, facts)
        prose = "" if problems else draft.text
        return CampaignReport(
            request_id=request_id,
            markdown=render(facts, prose, problems),
            cycles=len(facts.trials),
            checked=not problems,
            problems=tuple(problems[:50]),
            tokens_used=tokens,
            written_at=datetime.now(UTC),
        )

    async def _draft(self, objective: str, key: str) -> Draft:
        contract = Contract(Role.WRITER, objective, max_turns=_WRITER_TURNS, timeout_seconds=_WRITER_TIMEOUT_SECONDS)
        result = await self._desk.assign(contract, key)
        if result is None:
            return Draft("", 0, "the campaign's token budget is spent")
        tokens = result.usage.input_tokens + result.usage.output_tokens
        if not result.succeeded:
            return Draft("", tokens, result.error_message or "no report")
        return Draft(result.summary.strip()[:_MAX_REPORT_CHARS], tokens)


class Reports:
    """A campaign's reports, kept on its thread: written once per request_id, the latest read back."""

    def __init__(self, scratchpad: ResearchPlane, delegations: DelegationClient) -> None:
        self._scratchpad = scratchpad
        self._delegations = delegations

    def thread(self, campaign_id: str, thread_id: str) -> CampaignThread:
        return CampaignThread(self._scratchpad, campaign_id, thread_id or campaign_id)

    async def write(
        self, campaign_id: str, spec: CampaignSpec, thread: CampaignThread, request_id: str
    ) -> tuple[CampaignReport, bool]:
        """The report `request_id` wrote (and False), or a new one from the ledger as it is now (and True)."""
        records = await thread.read()
        earlier = _written(records, request_id)
        if earlier is not None:
            return earlier, False
        trials = [record for record in records if isinstance(record, TrialRecord)]
        signals = read_signals(trials, spec.metric.goal, spec.signal_rules())
        account = RunAccount()
        # One desk per report: its delegations' ids, and their assignment and usage entries, are its own.
        run_id = f"{campaign_id}-report-{hashlib.sha256(request_id.encode()).hexdigest()[:12]}"
        where = CampaignDesk(campaign_id, thread.thread_id, self._scratchpad, self._delegations)
        desk = campaign_desk(where, run_id, 1, account, TokenBudget(0, account))
        report = await Writer(desk).write(ReportFacts.of(spec, records, signals), request_id)
        await thread.write(report, f"report/{request_id}")
        return report, True

    async def latest(self, thread: CampaignThread) -> CampaignReport | None:
        reports = [record for record in await thread.read() if isinstance(record, CampaignReport)]
        return reports[-1] if reports else None


class CampaignReports:
    """WriteCampaignReport and GetCampaignReport: a campaign's reports, for any campaign of the store; and the
    report a campaign stopped by a human gets when its spec asks for one at the end."""

    def __init__(self, campaigns: Campaigns, reports: Reports) -> None:
        self._campaigns = campaigns
        self._reports = reports
        self._writing: set[asyncio.Task[None]] = set()

    def after_stop(self, record: StoredCampaign) -> None:
        """A campaign a human stopped gets its end report, written in the background (the loop writes it before
        the campaigns it completes end); `quarry lab report` writes one for any other."""
        if record.state is not CampaignState.STOPPED or not record.spec.write_report_at_end:
            return
        task = asyncio.create_task(self._write_at_end(record), name=f"report {record.campaign_id}")
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def _write_at_end(self, record: StoredCampaign) -> None:
        thread = self._reports.thread(record.campaign_id, record.scratchpad_thread_id)
        try:
            await self._reports.write(record.campaign_id, record.spec, thread, at_end(record.campaign_id))
        except QuarryError as error:
            log.warning("campaign %s: its end report was not written: %s", record.campaign_id, error)

    async def close(self) -> None:
        """Stop the reports being written (a human may write one again with `quarry lab report`)."""
        for task in list(self._writing):
            task.cancel()
        await asyncio.gather(*self._writing, return_exceptions=True)

    async def write(self, campaign_id: str, request_id: str) -> CampaignReport:
        ids.REQUEST_ID.require("request_id", request_id)
        record = await self._campaigns.get(campaign_id)
        thread = self._reports.thread(campaign_id, record.scratchpad_thread_id)
        report, _ = await self._reports.write(campaign_id, record.spec, thread, request_id)
        return report

    async def latest(self, campaign_id: str) -> CampaignReport:
        record = await self._campaigns.get(campaign_id)
        report = await self._reports.latest(self._reports.thread(campaign_id, record.scratchpad_thread_id))
        if report is None:
            raise NotFound("campaign report", campaign_id, field="campaign_id")
        return report


def at_end(campaign_id: str) -> str:
    """The request_id of a campaign's end report, whoever writes it (the loop, or a human's stop)."""
    return f"{campaign_id}/at-end"


def _written(records: Sequence[CampaignRecord], request_id: str) -> CampaignReport | None:
    for record in records:
        if isinstance(record, CampaignReport) and record.request_id == request_id:
            return record
    return None


def render(facts: ReportFacts, prose: str, problems: Sequence[str]) -> str:
    """The report's Markdown: a title, the writer's prose (or why it is left out), and code's ledger table."""
    lines = [f"# {_inline(facts.title)}: campaign report", ""]
    lines.append(
        f"Goal: {_inline(facts.goal)}. Metric: {facts.metric}, {facts.better} is better. Written from the "
        f"{len(facts.trials)} cycles of the ledger; every figure cites its cycle (c14: {facts.metric} 0.231)."
    )
    lines.append("")
    if prose:
        lines += [prose, ""]
    else:
        lines += ["> The writer's text is left out: it did not match the ledger.", ">"]
        lines += [f"> - {_inline(problem)}" for problem in problems[:20]]
        lines.append("")
        lines += [f"- {facts.cite(label)}" for label in ("baseline", "noise", "best") if label in facts.figures]
        lines.append("")
    lines += ["## Ledger", "", f"| cycle | verdict | {facts.metric} | hypothesis |", "|---:|---|---:|---|"]
    for trial in facts.trials:
        value = facts.figures.get(f"c{trial.cycle}")
        shown = f"{value:.6g}" if value is not None else "-"
        lines.append(f"| c{trial.cycle} | {trial.verdict.value} | {shown} | {_cell(trial.hypothesis)} |")
    if facts.dead_ends:
        lines += ["", "## Dead ends", ""]
        lines += [f"- c{d.cycle}: {_short(d.approach)}: {_short(d.reason)}" for d in facts.dead_ends]
    return "\n".join(lines) + "\n"


def _fact_row(facts: ReportFacts, trial: TrialRecord) -> str:
    label = f"c{trial.cycle}"
    result = (
        facts.cite(label) if label in facts.figures else f"{label}: no {facts.metric} ({trial.job_state or 'no job'})"
    )
    return f"- {result}; {trial.verdict.value}; {_short(trial.hypothesis)}"


def _fit(rows: list[str], budget: int) -> list[str]:
    if sum(len(row) + 1 for row in rows) <= budget:
        return rows
    first, last, size = 10, len(rows), 0
    for index in range(len(rows) - 1, first, -1):  # the latest rows that fit after the first ten
        size += len(rows[index]) + 1
        if size + sum(len(row) + 1 for row in rows[:first]) + 80 > budget:
            break
        last = index
    return [*rows[:first], f"- ({last - first} cycles left out here)", *rows[last:]]


def _agrees(written: str, value: float) -> bool:
    """The ledger's value at the precision written (0.231 for 0.23149)."""
    digits = len(re.sub(r"[^0-9]", "", re.split(r"[eE]", written)[0]).lstrip("0")) or 1
    return f"{float(written):.{digits}g}" == f"{value:.{digits}g}"


def _canonical(number: str) -> str:
    return repr(float(number))


def _short(text: str) -> str:
    return clip_line(text, _TEXT_CHARS)


def _inline(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    return _short(text).replace("|", "\\|")
