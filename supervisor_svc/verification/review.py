"""The draft report's review: blind citation audits, objections, revision rounds and adjudication.

Every cited sentence gets its own blind citation auditor, all in parallel: the auditor sees the
question, its one sentence (its markers naming the findings it cites) and those findings, never the
report's other sentences. An unsound sentence raises an objection, and every open objection blocks
the report: the supervisor's model rewrites the sentence (one call without tools, within bounded
rounds, each revision audited again), or contests the objection, or withdraws the sentence. A
contested objection, and one still open after the rounds, goes to a blind adjudicator: approve keeps
the sentence as written, revise sends it back to revision while a round is left, reject removes it.
Whatever is still unsettled then (a failed adjudicator, a spent budget, a revision asked for with no
round left) leaves the report, unless the run waits for a person's approval: then it stays in, its
objection open, for the person to decide (`approve_open_objections` records their approval).

Each objection is closed by one ObjectionResolution the supervisor appends to the ledger, with a
request id made of the run and the objection, so a retried append writes nothing twice.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from quarry.agent.messages import system, user
from quarry.agent.model import ModelClient, ProviderError
from quarry.agent.usage import Usage
from quarry.identity import Role
from quarry.records.base import RecordError
from quarry.records.research import (
    Adjudication,
    AdjudicationDecision,
    CitationAudit,
    CitationJudgement,
    ObjectionResolution,
    Resolution,
)
from quarry.research_plane import ResearchPlane
from quarry.vocabulary import DelegationResult
from supervisor_svc.budget import TokenBudget
from supervisor_svc.delegating import Contract, Delegator
from supervisor_svc.ledger import RunLedger
from supervisor_svc.model import Citation, Report
from supervisor_svc.synthesis import CitationFilter
from supervisor_svc.verification.sentences import Draft, Sentence, cite_findings, finding_numbers, split_report
from supervisor_svc.verification.state import (
    ObjectionState,
    ObjectionStatus,
    SentenceCheck,
    SentenceStatus,
    Verification,
)

log = logging.getLogger(__name__)

# Cited sentences audited at most; the rest stand, marked unaudited.
MAX_AUDITED_SENTENCES = 50
# A contract names at most this many findings (a worker's bound on input refs, less one for an objection).
MAX_FINDINGS_PER_SENTENCE = 19
# Bounds on what one prompt carries.
_MAX_SENTENCE_CHARS = 2000
_MAX_QUESTION_CHARS = 4000
_MAX_SOURCES_SHOWN = 100
_MAX_EXCERPT_CHARS = 400
_MAX_REASON_CHARS = 4000

REVISER_INSTRUCTIONS = (
    "You revise one sentence of a research report that a citation auditor objected to. You are given the "
    "question, the sentence, the objection, and the numbered sources the report may cite with the findings "
    "they back. Answer with exactly one of:\n"
    "- the rewritten sentence, saying only what its sources support and citing them as [n];\n"
    "- ADJUDICATE: <why the sentence stands as written>, if the objection is wrong;\n"
    "- REMOVE, if no source supports the sentence.\n"
    "Answer with nothing else: no preamble, no quotes around the sentence."
)
_CONTEST = "ADJUDICATE:"
_REMOVED_BECAUSE = {
    AdjudicationDecision.REJECT: "the adjudicator rejected the sentence",
    AdjudicationDecision.REVISE: "the adjudicator asked for a revision and no round was left",
}
_WITHDRAW = "REMOVE"

AUDIT_CRITERIA = (
    "Judge the sentence only against the findings it cites; read them in the scratchpad.",
    "Sound: the findings say what the sentence says. Needs revision: they support only a weaker or narrower "
    "statement. Unsound: they do not support it.",
)
ADJUDICATION_CRITERIA = (
    "Read the objection and the findings in the scratchpad, and decide from them alone.",
    "Approve if the findings support the sentence as written; revise if they support a corrected version; "
    "reject if they do not support it.",
)


class ReviewStage(enum.StrEnum):
    """What the review is doing, as the run's status events say it (ResearchPhase has the same values)."""

    AUDITING = "auditing"
    REVISING = "revising"
    ADJUDICATING = "adjudicating"


StatusListener = Callable[[ReviewStage, str], Awaitable[None]]


@dataclass(frozen=True)
class ReviewedReport:
    """The reviewed report and how its sentences fared, for the run's Verification."""

    report: Report
    sentences: tuple[SentenceCheck, ...]
    objections: tuple[ObjectionState, ...]
    revision_rounds: int
    usage: Usage  # the revising calls of the supervisor's model (already counted on the budget's account)


@dataclass
class _Tracked:
    """One cited sentence while it is reviewed."""

    sentence: Sentence
    text: str  # as the report has it now (its last revision)
    findings: tuple[int, ...]  # the findings that text cites
    status: SentenceStatus = SentenceStatus.UNAUDITED
    audits: list[int] = field(default_factory=list)
    objections: list[int] = field(default_factory=list)  # oldest first; the last one is the open one
    adjudicated: set[int] = field(default_factory=set)  # objections an adjudicator has decided
    contest: bool = False  # the reviser contests the open objection
    advice: str = ""  # an adjudicator's reason to revise

    @property
    def index(self) -> int:
        return self.sentence.index

    @property
    def open_objection(self) -> int:
        return self.objections[-1]


async def review_report(
    *,
    question: str,
    draft: Report,
    sources: Sequence[Citation],
    claims: Mapping[int, str],
    delegator: Delegator,
    model: ModelClient,
    budget: TokenBudget,
    scratchpad: ResearchPlane,
    run_id: str,
    thread_id: str,
    status: StatusListener,
    max_revision_rounds: int = 2,
    max_sentences: int = MAX_AUDITED_SENTENCES,
    leave_unsettled_open: bool = False,
) -> ReviewedReport:
    """Review `draft` until no objection is open, or, with `leave_unsettled_open` (a person approves the
    run), until only those the review cannot settle are: their sentences stay, SentenceStatus.OBJECTED.

    `sources`: every numbered source the report may cite (the draft's markers use these numbers);
    `claims`: each citable finding's claim, by its sequence number. The reviser's model calls are
    added to `budget.account.report` and stop once the budget is spent."""
    review = _Review(
        question,
        draft,
        sources,
        claims,
        delegator,
        model,
        budget,
        scratchpad,
        run_id,
        thread_id,
        status,
        leave_unsettled_open=leave_unsettled_open,
    )
    return await review.run(max(max_revision_rounds, 0), max(max_sentences, 0))


class _Review:
    def __init__(
        self,
        question: str,
        draft: Report,
        sources: Sequence[Citation],
        claims: Mapping[int, str],
        delegator: Delegator,
        model: ModelClient,
        budget: TokenBudget,
        scratchpad: ResearchPlane,
        run_id: str,
        thread_id: str,
        status: StatusListener,
        *,
        leave_unsettled_open: bool,
    ) -> None:
        self._question = question[:_MAX_QUESTION_CHARS]
        self._report = draft
        self._sources = {source.number: source for source in sources}
        self._claims = claims
        self._delegator = delegator
        self._model = model
        self._budget = budget
        self._scratchpad = scratchpad
        self._run_id = run_id
        self._thread_id = thread_id
        self._status = status
        self._leave_unsettled_open = leave_unsettled_open
        self._draft: Draft = split_report(draft.markdown, sources)
        self._objections: dict[int, ObjectionState] = {}
        self._usage = Usage()
        self._removed_citations = 0

    async def run(self, max_rounds: int, max_sentences: int) -> ReviewedReport:
        audited = [
            _Tracked(s, s.text, s.finding_sequence_nos[:MAX_FINDINGS_PER_SENTENCE])
            for s in self._draft.cited()[:max_sentences]
        ]
        if audited:
            await self._status(ReviewStage.AUDITING, f"auditing {len(audited)} cited sentences")
            await _all(self._audit(tracked, revision=0, sharing=len(audited)) for tracked in audited)
        rounds = 0
        for round_no in range(1, max_rounds + 1):
            to_revise = [t for t in audited if t.status is SentenceStatus.OBJECTED and not t.contest]
            if to_revise:
                rounds = round_no
                await self._status(ReviewStage.REVISING, f"round {round_no}: revising {len(to_revise)} sentences")
                await _all(self._revise(t, round_no, sharing=len(to_revise)) for t in to_revise)
            contested = [t for t in audited if t.status is SentenceStatus.OBJECTED and t.contest]
            if contested:
                await self._adjudicate_all(contested, revision_left=round_no < max_rounds)
            if not any(t.status is SentenceStatus.OBJECTED for t in audited):
                break
        # Still open after the rounds: an adjudicator decides, once per objection; whatever stays open goes.
        still_open = [t for t in audited if t.status is SentenceStatus.OBJECTED]
        undecided = [t for t in still_open if t.open_objection not in t.adjudicated]
        if undecided:
            await self._adjudicate_all(undecided, revision_left=False)
        for tracked in audited:
            if tracked.status is SentenceStatus.OBJECTED:
                await self._unsettled(tracked, "no revision round was left to settle the objection")
        return self._reviewed(audited, rounds)

    # -- audits -----------------------------------------------------------------------------------

    async def _audit(self, tracked: _Tracked, *, revision: int, sharing: int) -> bool | None:
        """Audit the sentence as it stands: True when judged sound, False when not (an objection is then
        open), None when no auditor judged it."""
        index = tracked.index
        heading = f"Audit sentence {index}" + (f" (revision {revision})" if revision else "")
        cited = cite_findings(tracked.text, self._sources)[:_MAX_SENTENCE_CHARS]
        findings = ", ".join(map(str, tracked.findings))
        objective = (
            f"{heading}\n\nThe research question: {self._question}\n\n"
            f'Sentence {index} of a draft report: "{cited}"\n\n'
            f"It cites findings {findings} (scratchpad entries). Submit your audit of sentence_index {index} "
            f"with finding_refs [{findings}]."
        )
        contract = Contract(Role.CITATION_AUDITOR, objective, AUDIT_CRITERIA, tuple(map(str, tracked.findings)))
        result = await self._delegator.assign(contract, f"audit-{index}-r{revision}", sharing=sharing)
        verdict = _sentence_audit(result, index)
        if verdict is None:
            return None
        audit_sequence_no, judgement, objection_sequence_no, reason = verdict
        tracked.audits.append(audit_sequence_no)
        if judgement is CitationJudgement.SOUND:
            if not tracked.objections:
                tracked.status = SentenceStatus.SOUND
            return True
        if not objection_sequence_no:
            log.warning(
                "run %s: sentence %d was judged %s but no objection was recorded", self._run_id, index, judgement
            )
            return None
        tracked.objections.append(objection_sequence_no)
        self._objections[objection_sequence_no] = ObjectionState(objection_sequence_no, index, reason)
        tracked.status = SentenceStatus.OBJECTED
        tracked.contest = False
        return False

    # -- revisions --------------------------------------------------------------------------------

    async def _revise(self, tracked: _Tracked, round_no: int, *, sharing: int) -> None:
        answer = await self._reviser_answer(tracked, round_no)
        if answer is None:
            return  # no revision this round: the objection stays open
        if answer.rstrip(".").upper() == _WITHDRAW:
            await self._remove(tracked, "the supervisor withdrew the sentence")
            return
        if answer.upper().startswith(_CONTEST):
            # Contested: an adjudicator decides, unless one already asked for this very objection's revision.
            tracked.contest = tracked.open_objection not in tracked.adjudicated
            return
        citations = CitationFilter(self._sources)
        revised = " ".join((citations.feed(answer) + citations.finish()).split())[:_MAX_SENTENCE_CHARS]
        self._removed_citations += citations.removed
        _, findings = finding_numbers(revised, self._sources)
        if not findings:
            log.info("run %s: revision of sentence %d cites no source", self._run_id, tracked.index)
            return
        before = tracked.text, tracked.findings
        tracked.text, tracked.findings = revised, findings[:MAX_FINDINGS_PER_SENTENCE]
        audited = await self._audit(tracked, revision=round_no, sharing=sharing)
        if audited is None:  # no auditor judged the revision: the sentence stays as it was, still objected to
            tracked.text, tracked.findings = before
            return
        tracked.advice = ""
        if audited:
            await self._settle(
                tracked,
                SentenceStatus.REVISED,
                ObjectionStatus.REVISED,
                Resolution.REVISED,
                audit_ref=tracked.audits[-1],
            )

    async def _reviser_answer(self, tracked: _Tracked, round_no: int) -> str | None:
        """The supervisor's model on one objected sentence: a revision, a contest, REMOVE; None if it gave none."""
        if self._budget.spent():
            return None
        objection = self._objections[tracked.open_objection]
        heading = f"Revise sentence {tracked.index}" + (f" (round {round_no})" if round_no > 1 else "")
        parts = [
            f"Task: {heading}",
            f"Question: {self._question}",
            f"The sentence: {tracked.text[:_MAX_SENTENCE_CHARS]}",
            f"The objection: {objection.reason[:_MAX_REASON_CHARS]}",
        ]
        if tracked.advice:
            parts.append(f"An adjudicator asked for a revision: {tracked.advice[:_MAX_REASON_CHARS]}")
        parts.append("Sources the report may cite:\n" + self._sources_listing())
        try:
            reply = await self._model.complete(
                [system(REVISER_INSTRUCTIONS), user("\n\n".join(parts))], (), call_id_prefix="revise"
            )
        except ProviderError as error:
            log.warning("run %s: revising sentence %d failed: %s", self._run_id, tracked.index, error)
            return None
        usage = reply.usage + Usage(model_calls=1)
        self._usage += usage
        self._budget.account.report += usage
        # A sentence in quotes is still the sentence.
        answer = reply.message.content.strip().strip('"\u201c\u201d').strip()
        return answer or None

    def _sources_listing(self) -> str:
        lines = []
        for source in list(self._sources.values())[:_MAX_SOURCES_SHOWN]:
            claim = self._claims.get(source.sequence_no, "")[:_MAX_EXCERPT_CHARS]
            excerpt = source.excerpt[:_MAX_EXCERPT_CHARS]
            lines.append(f'[{source.number}] finding {source.sequence_no}: {claim}\n    "{excerpt}" ({source.url})')
        return "\n".join(lines) or "(none)"

    # -- adjudication -----------------------------------------------------------------------------

    async def _adjudicate_all(self, sentences: Sequence[_Tracked], *, revision_left: bool) -> None:
        await self._status(ReviewStage.ADJUDICATING, f"adjudicating {len(sentences)} objections")
        await _all(self._adjudicate(t, revision_left, sharing=len(sentences)) for t in sentences)

    async def _adjudicate(self, tracked: _Tracked, revision_left: bool, *, sharing: int) -> None:
        objection = tracked.open_objection
        tracked.contest = False
        tracked.adjudicated.add(objection)
        text = cite_findings(tracked.text, self._sources)[:_MAX_SENTENCE_CHARS]
        objective = (
            f"Adjudicate objection {objection}\n\nThe research question: {self._question}\n\n"
            f'Objection {objection} was raised against sentence {tracked.index} of a draft report: "{text}"\n\n'
            f"Decide it with objection_ref {objection}."
        )
        refs = (str(objection), *map(str, tracked.findings))
        contract = Contract(Role.ADJUDICATOR, objective, ADJUDICATION_CRITERIA, refs)
        result = await self._delegator.assign(contract, f"adjudicate-{objection}", sharing=sharing)
        decided = _adjudication(result, objection)
        if decided is None:
            reason = "the token budget was spent" if result is None else "no adjudicator could decide the objection"
            await self._unsettled(tracked, reason)
            return
        sequence_no, adjudication = decided
        self._objections[objection] = replace(self._objections[objection], adjudication_sequence_no=sequence_no)
        if adjudication.decision is AdjudicationDecision.APPROVE:
            await self._settle(
                tracked,
                SentenceStatus.UPHELD,
                ObjectionStatus.DISMISSED,
                Resolution.DISMISSED,
                adjudication_ref=sequence_no,
            )
        elif adjudication.decision is AdjudicationDecision.REVISE and revision_left:
            tracked.advice = adjudication.rationale
        elif adjudication.decision is AdjudicationDecision.REVISE:
            await self._unsettled(tracked, _REMOVED_BECAUSE[adjudication.decision], adjudication_ref=sequence_no)
        else:
            await self._remove(tracked, _REMOVED_BECAUSE[adjudication.decision], adjudication_ref=sequence_no)

    # -- resolutions ------------------------------------------------------------------------------

    async def _unsettled(self, tracked: _Tracked, reason: str, *, adjudication_ref: int | None = None) -> None:
        """An objection the review cannot settle: the sentence goes, or stays for a person to decide."""
        if self._leave_unsettled_open:
            log.info("run %s: sentence %d awaits a person: %s", self._run_id, tracked.index, reason)
            return
        await self._remove(tracked, reason, adjudication_ref=adjudication_ref)

    async def _remove(self, tracked: _Tracked, reason: str, *, adjudication_ref: int | None = None) -> None:
        await self._settle(
            tracked,
            SentenceStatus.REMOVED,
            ObjectionStatus.SENTENCE_REMOVED,
            Resolution.SENTENCE_REMOVED,
            adjudication_ref=adjudication_ref,
            reason=reason,
        )

    async def _settle(
        self,
        tracked: _Tracked,
        sentence_status: SentenceStatus,
        objection_status: ObjectionStatus,
        resolution: Resolution,
        *,
        audit_ref: int | None = None,
        adjudication_ref: int | None = None,
        reason: str = "",
    ) -> None:
        """Close every objection raised against the sentence: the last one decided it, the earlier ones
        were raised against versions the report no longer has."""
        tracked.status = sentence_status
        for objection in tracked.objections:
            state = self._objections[objection]
            if state.status is not ObjectionStatus.OPEN:
                continue
            superseded = objection != tracked.open_objection
            record = ObjectionResolution(
                objection_ref=objection,
                resolution=resolution,
                sentence_index=tracked.index,
                sentence=tracked.text[:_MAX_REASON_CHARS],
                audit_ref=audit_ref,
                adjudication_ref=adjudication_ref,
                reason=("raised against an earlier version of the sentence; " if superseded else "") + reason,
            )
            resolved = await _record(self._scratchpad, self._run_id, self._thread_id, record)
            self._objections[objection] = replace(state, status=objection_status, resolution_sequence_no=resolved)

    # -- the result -------------------------------------------------------------------------------

    def _reviewed(self, audited: Sequence[_Tracked], rounds: int) -> ReviewedReport:
        by_index = {t.index: t for t in audited}
        removed = {t.index for t in audited if t.status is SentenceStatus.REMOVED}
        # A revised text stands once revised, upheld, or left open (the text its objection was raised against).
        replaced = {t.index: t.text for t in audited if t.text != t.sentence.text}
        markdown = self._draft.rebuild(replaced, removed)
        citations = CitationFilter(self._sources)
        citations.feed(markdown)
        citations.finish()
        report = replace(
            self._report,
            markdown=markdown,
            citations=citations.citations(),
            removed_citations=self._report.removed_citations + self._removed_citations,
        )
        checks = []
        for sentence in self._draft.cited():
            tracked = by_index.get(sentence.index)
            if tracked is None:  # past the bound on audited sentences
                checks.append(
                    SentenceCheck(
                        sentence.index, sentence.text, sentence.finding_sequence_nos, SentenceStatus.UNAUDITED
                    )
                )
                continue
            checks.append(
                SentenceCheck(tracked.index, tracked.text, tracked.findings, tracked.status, tuple(tracked.audits))
            )
        objections = tuple(self._objections[n] for n in sorted(self._objections))
        return ReviewedReport(report, tuple(checks), objections, rounds, self._usage)


async def approve_open_objections(
    verification: Verification, comment: str, *, scratchpad: ResearchPlane, run_id: str, thread_id: str
) -> Verification:
    """A person approved the run: each objection still open is closed by their approval (the comment its
    reason) and its sentence, already in the report as written, is upheld."""
    still_open = verification.open_objections
    if not still_open:
        return verification
    texts = {sentence.sentence_index: sentence.text for sentence in verification.sentences}
    reason = comment.strip()[:_MAX_REASON_CHARS] or "approved by a person without a comment"
    settled = {}
    for objection in still_open:
        record = ObjectionResolution(
            objection_ref=objection.objection_sequence_no,
            resolution=Resolution.APPROVED_BY_PERSON,
            sentence_index=objection.sentence_index,
            sentence=texts[objection.sentence_index][:_MAX_REASON_CHARS],
            reason=reason,
        )
        settled[objection.objection_sequence_no] = replace(
            objection,
            status=ObjectionStatus.APPROVED_BY_PERSON,
            resolution_sequence_no=await _record(scratchpad, run_id, thread_id, record),
        )
    upheld = {objection.sentence_index for objection in still_open}
    return replace(
        verification,
        objections=tuple(settled.get(o.objection_sequence_no, o) for o in verification.objections),
        sentences=tuple(
            replace(s, status=SentenceStatus.UPHELD)
            if s.sentence_index in upheld and s.status is SentenceStatus.OBJECTED
            else s
            for s in verification.sentences
        ),
    )


async def _record(scratchpad: ResearchPlane, run_id: str, thread_id: str, resolution: ObjectionResolution) -> int:
    """Append a resolution to the run's ledger; its entry's number, or 0 when the scratchpad would not take it
    (the run goes on: the report does not wait on a scratchpad hiccup). The request id names the run and
    the objection, so a retried append writes nothing twice."""
    objection = resolution.objection_ref
    return await RunLedger(scratchpad, run_id, thread_id).record(
        lambda: resolution, f"resolution/{objection}", f"the resolution of objection {objection}"
    )


def _sentence_audit(result: DelegationResult | None, index: int) -> tuple[int, CitationJudgement, int, str] | None:
    """(audit entry, judgement of sentence `index`, its objection's entry or 0, the objection) from an
    auditor's result; None when it failed, or judged some other sentence."""
    if result is None or not result.succeeded or not result.output_sequence_no:
        return None
    try:
        audit = CitationAudit.parse(result.output_json)
    except RecordError as error:
        log.warning("an auditor's output is no citation audit: %s", error)
        return None
    assert isinstance(audit, CitationAudit)
    judged = [sentence for sentence in audit.sentences if sentence.sentence_index == index]
    if not judged:
        return None
    # The worker records the objections right after the audit, in the audit's order.
    objected = [s.sentence_index for s in audit.sentences if s.judgement is not CitationJudgement.SOUND]
    after = sorted(n for n in result.promoted if n > result.output_sequence_no)
    objection = after[objected.index(index)] if index in objected and len(after) == len(objected) else 0
    return result.output_sequence_no, judged[0].judgement, objection, judged[0].objection


def _adjudication(result: DelegationResult | None, objection: int) -> tuple[int, Adjudication] | None:
    if result is None or not result.succeeded or not result.output_sequence_no:
        return None
    try:
        adjudication = Adjudication.parse(result.output_json)
    except RecordError as error:
        log.warning("an adjudicator's output is no adjudication: %s", error)
        return None
    assert isinstance(adjudication, Adjudication)
    if adjudication.objection_ref != objection:
        return None
    return result.output_sequence_no, adjudication


async def _all(steps: Iterable[Coroutine[Any, Any, object]]) -> None:
    """Run `steps` at once; if one fails, the others are cancelled rather than left running past the run."""
    async with asyncio.TaskGroup() as group:
        for step in steps:
            group.create_task(step)
