"""The draft report's review: blind citation audits, objections, revision rounds and adjudication.

Every cited sentence gets its own blind citation auditor, all in parallel: the auditor sees the
question, its one sentence (its markers naming the findings it cites) and those findings, never the
report's other sentences. A sentence that fails a citation check of the code (checks.py: a marker that
named no citable source, one side of a contradiction cited alone) is objected to without an audit, and
only a revision that passes the check and its audit settles that objection. An unsound sentence raises
an objection, and every open objection blocks
the report: the supervisor's model rewrites the sentence (one call without tools, within bounded
rounds, each revision audited again), or contests the objection, or withdraws the sentence. A
contested objection, and one still open after the rounds, goes to a blind adjudicator: approve keeps
the sentence as written, revise sends it back to revision while a round is left, reject removes it.
Whatever is still unsettled then (a failed adjudicator, a spent budget, a revision asked for with no
round left) leaves the report, unless the run waits for a person's approval: then it stays in, its
objection open, for the person to decide (`approve_open_objections` records their approval).

The review works with the run's own means (`ReviewDesk`): its delegation desk orders the blind roles
(audits.py), its model revises (revision.py), its ledger records how each objection ended
(resolutions.py). Nothing of the run is rebuilt here.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from quarry.agent.model import ModelClient
from quarry.agent.usage import Usage
from quarry.records.research import (
    AdjudicationDecision,
    CitationJudgement,
    DraftSentence,
    Objection,
    ObjectionResolution,
    Resolution,
)
from quarry.records.verification import ObjectionState, ObjectionStatus, SentenceCheck, SentenceStatus
from supervisor_svc.runs.budget import TokenBudget
from supervisor_svc.runs.delegating import Delegator
from supervisor_svc.runs.domain import Citation, Report
from supervisor_svc.runs.ledger import RunLedger
from supervisor_svc.runs.synthesis import CitationFilter
from supervisor_svc.verification.audits import (
    MAX_FINDINGS_PER_SENTENCE,
    FindingContext,
    adjudication_contract,
    audit_contract,
    read_adjudication,
    read_audit,
)
from supervisor_svc.verification.checks import Contested, Flag, flag_draft, one_sided
from supervisor_svc.verification.resolutions import MAX_REASON_CHARS, record_resolution
from supervisor_svc.verification.revision import Reviser, contests, rewrite, withdraws
from supervisor_svc.verification.sentences import Draft, Sentence, cite_findings, split_report

log = logging.getLogger(__name__)

# Cited sentences audited at most; the rest stand, marked unaudited.
MAX_AUDITED_SENTENCES = 50
_MAX_QUESTION_CHARS = 4000

_REMOVED_BECAUSE = {
    AdjudicationDecision.REJECT: "the adjudicator rejected the sentence",
    AdjudicationDecision.REVISE: "the adjudicator asked for a revision and no round was left",
}


class ReviewStage(enum.StrEnum):
    """What the review is doing, as the run's status events say it (ResearchPhase has the same values)."""

    AUDITING = "auditing"
    REVISING = "revising"
    ADJUDICATING = "adjudicating"


StatusListener = Callable[[ReviewStage, str], Awaitable[None]]


# Put before a cited sentence in the report's body when no auditor judged it.
UNVERIFIED_MARK = "(unverified) "


@dataclass(frozen=True)
class ReviewRequest:
    """What is reviewed, and how far the review may go."""

    question: str
    draft: Report
    # Every numbered source the report may cite (the draft's markers use these numbers).
    sources: Sequence[Citation]
    # Each citable finding's claim, by its sequence number.
    claims: Mapping[int, str]
    # What auditors and adjudicators are told of each finding beside its claim (audits.finding_context).
    context: FindingContext = field(default_factory=dict)
    # Both sides of every contradiction: a sentence citing one side without the other fails a citation check.
    contested: Contested = field(default_factory=dict)
    max_revision_rounds: int = 2
    max_sentences: int = MAX_AUDITED_SENTENCES
    # A person approves the run: what the review cannot settle stays in, its objection open.
    leave_unsettled_open: bool = False


@dataclass(frozen=True)
class ReviewDesk:
    """The run's own means, as the run holds them: the review builds none of them."""

    run_id: str
    delegator: Delegator  # orders the auditors and adjudicators, within the run's bounds and budget
    ledger: RunLedger  # the one the delegator writes to: the resolutions go there too
    model: ModelClient  # the supervisor's model, which revises
    budget: TokenBudget  # the revising calls are added to its account's report usage
    status: StatusListener


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


async def review_report(request: ReviewRequest, desk: ReviewDesk) -> ReviewedReport:
    """Review the draft until no objection is open, or, with `leave_unsettled_open` (a person approves the
    run), until only those the review cannot settle are: their sentences stay, SentenceStatus.OBJECTED.
    The reviser's model calls stop once the run's budget is spent."""
    review = _Review(request, desk)
    return await review.run(max(request.max_revision_rounds, 0), max(request.max_sentences, 0))


class _Review:
    def __init__(self, request: ReviewRequest, desk: ReviewDesk) -> None:
        self._question = request.question[:_MAX_QUESTION_CHARS]
        self._report = request.draft
        self._sources = {source.number: source for source in request.sources}
        self._context = request.context
        self._contested = request.contested
        self._desk = desk
        self._leave_unsettled_open = request.leave_unsettled_open
        self._reviser = Reviser(desk.model, desk.budget, self._question, self._sources, request.claims, desk.run_id)
        self._draft: Draft = split_report(request.draft.markdown, request.sources)
        # Names this draft's entries on the ledger: a draft written again (a run taken up) gets entries of its own.
        self._draft_id = hashlib.sha256(request.draft.markdown.encode()).hexdigest()[:16]
        self._objections: dict[int, ObjectionState] = {}
        self._flags = flag_draft(self._draft, request.draft.invalid_markers, request.contested)
        self._checked: set[int] = set()  # the objections citation checks raised: no adjudicator dismisses them
        self._rounds = 0  # the last round in which a sentence was rewritten
        self._removed_citations = 0

    async def run(self, max_rounds: int, max_sentences: int) -> ReviewedReport:
        # Every sentence a citation check flags is reviewed, whatever the bound on audited sentences.
        chosen = {s.index: s for s in self._draft.cited()[:max_sentences]}
        chosen.update((s.index, s) for s in self._draft.sentences if s.index in self._flags)
        audited = [
            _Tracked(s, s.text, s.finding_sequence_nos[:MAX_FINDINGS_PER_SENTENCE]) for _, s in sorted(chosen.items())
        ]
        # The ledger gets every sentence the review judges or leaves unjudged, as drafted, before any audit.
        drafted = [s for s in self._draft.sentences if s.cited or s.index in self._flags]
        await _all(
            self._record_version(s.index, 0, s.text, s.finding_sequence_nos[:MAX_FINDINGS_PER_SENTENCE])
            for s in drafted
        )
        status = self._desk.status
        flagged = [t for t in audited if t.index in self._flags]
        if flagged:
            await status(ReviewStage.AUDITING, f"{len(flagged)} sentences fail a citation check")
            await _all(self._object(t, self._flags[t.index]) for t in flagged)
        to_audit = [t for t in audited if t.index not in self._flags]
        if to_audit:
            await status(ReviewStage.AUDITING, f"auditing {len(to_audit)} cited sentences")
            await _all(self._audit(tracked, revision=0, sharing=len(to_audit)) for tracked in to_audit)
        for round_no in range(1, max_rounds + 1):
            to_revise = [t for t in audited if t.status is SentenceStatus.OBJECTED and not t.contest]
            if to_revise:
                await status(ReviewStage.REVISING, f"round {round_no}: revising {len(to_revise)} sentences")
                await _all(self._revise(t, round_no, sharing=len(to_revise)) for t in to_revise)
            contested = [t for t in audited if t.status is SentenceStatus.OBJECTED and t.contest]
            if contested:
                await self._adjudicate_all(contested, revision_left=round_no < max_rounds)
            if not any(t.status is SentenceStatus.OBJECTED for t in audited):
                break
        # Still open after the rounds: an adjudicator decides, once per objection; whatever stays open goes.
        still_open = [t for t in audited if t.status is SentenceStatus.OBJECTED]
        undecided = [t for t in still_open if t.open_objection not in t.adjudicated | self._checked]
        if undecided:
            await self._adjudicate_all(undecided, revision_left=False)
        for tracked in audited:
            if tracked.status is not SentenceStatus.OBJECTED:
                continue
            if tracked.open_objection in self._checked:
                await self._unsettled(tracked, "no revision passed the citation check")
            else:
                await self._unsettled(tracked, "no revision round was left to settle the objection")
        return self._reviewed(audited)

    # -- citation checks --------------------------------------------------------------------------

    async def _object(self, tracked: _Tracked, flag: Flag) -> None:
        """The objection a failed citation check raises, on the ledger like an auditor's; a sentence whose
        objection cannot be recorded leaves the report unreviewed (the review fails closed)."""
        index = tracked.index

        def objection() -> Objection:
            return Objection(check=flag.check, sentence_index=index, finding_refs=tracked.findings, reason=flag.reason)

        raised = await self._desk.ledger.record(
            objection, f"check/{self._draft_id}/{index}", f"the citation check of sentence {index}"
        )
        if not raised:
            tracked.status = SentenceStatus.REMOVED
            return
        tracked.objections.append(raised)
        self._objections[raised] = ObjectionState(raised, index, flag.reason)
        self._checked.add(raised)
        tracked.status = SentenceStatus.OBJECTED

    # -- audits -----------------------------------------------------------------------------------

    async def _audit(self, tracked: _Tracked, *, revision: int, sharing: int) -> bool | None:
        """Audit the sentence as it stands: True when judged sound, False when not (an objection is then
        open), None when no auditor judged it."""
        index = tracked.index
        cited = cite_findings(tracked.text, self._sources)
        contract = audit_contract(self._question, index, cited, tracked.findings, revision, self._context)
        result = await self._desk.delegator.assign(contract, f"audit-{index}-r{revision}", sharing=sharing)
        verdict = read_audit(result, index)
        if verdict is None:
            return None
        tracked.audits.append(verdict.audit_sequence_no)
        if verdict.judgement is CitationJudgement.SOUND:
            if not tracked.objections:
                tracked.status = SentenceStatus.SOUND
            return True
        objection = verdict.objection_sequence_no
        if not objection:
            log.warning(
                "run %s: sentence %d was judged %s but no objection was recorded",
                self._desk.run_id,
                index,
                verdict.judgement,
            )
            return None
        tracked.objections.append(objection)
        self._objections[objection] = ObjectionState(objection, index, verdict.objection)
        tracked.status = SentenceStatus.OBJECTED
        tracked.contest = False
        return False

    # -- revisions --------------------------------------------------------------------------------

    async def _revise(self, tracked: _Tracked, round_no: int, *, sharing: int) -> None:
        objection = self._objections[tracked.open_objection].reason
        answer = await self._reviser.answer(tracked.index, tracked.text, objection, tracked.advice, round_no)
        if answer is None:
            return  # no revision this round: the objection stays open
        if withdraws(answer):
            await self._remove(tracked, "the supervisor withdrew the sentence")
            return
        if contests(answer):
            # Contested: an adjudicator decides, unless one already asked for this very objection's revision;
            # a citation check's objection is no judgement to contest.
            tracked.contest = tracked.open_objection not in tracked.adjudicated | self._checked
            return
        revised = rewrite(answer, self._sources)
        self._removed_citations += revised.removed_citations
        if not revised.findings:
            log.info("run %s: revision of sentence %d cites no source", self._desk.run_id, tracked.index)
            return
        if revised.removed_citations or one_sided(revised.findings, self._contested):
            log.info("run %s: revision of sentence %d fails a citation check", self._desk.run_id, tracked.index)
            return
        before = tracked.text, tracked.findings
        tracked.text, tracked.findings = revised.text, revised.findings
        await self._record_version(tracked.index, round_no, tracked.text, tracked.findings)
        self._rounds = max(self._rounds, round_no)
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

    # -- adjudication -----------------------------------------------------------------------------

    async def _adjudicate_all(self, sentences: Sequence[_Tracked], *, revision_left: bool) -> None:
        await self._desk.status(ReviewStage.ADJUDICATING, f"adjudicating {len(sentences)} objections")
        await _all(self._adjudicate(t, revision_left, sharing=len(sentences)) for t in sentences)

    async def _adjudicate(self, tracked: _Tracked, revision_left: bool, *, sharing: int) -> None:
        objection = tracked.open_objection
        tracked.contest = False
        tracked.adjudicated.add(objection)
        cited = cite_findings(tracked.text, self._sources)
        contract = adjudication_contract(
            self._question, objection, tracked.index, cited, tracked.findings, self._context
        )
        result = await self._desk.delegator.assign(contract, f"adjudicate-{objection}", sharing=sharing)
        decided = read_adjudication(result, objection)
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
            log.info("run %s: sentence %d awaits a person: %s", self._desk.run_id, tracked.index, reason)
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
                sentence=tracked.text[:MAX_REASON_CHARS],
                audit_ref=audit_ref,
                adjudication_ref=adjudication_ref,
                reason=("raised against an earlier version of the sentence; " if superseded else "") + reason,
            )
            resolved = await record_resolution(self._desk.ledger, record)
            self._objections[objection] = replace(state, status=objection_status, resolution_sequence_no=resolved)

    # -- the result -------------------------------------------------------------------------------

    async def _record_version(self, index: int, revision: int, text: str, findings: tuple[int, ...]) -> None:
        """Put a sentence on the ledger as it is about to be judged: as drafted (0), or revised in a round."""

        def version() -> DraftSentence:
            return DraftSentence(
                draft=self._draft_id,
                sentence_index=index,
                revision=revision,
                text=text[:MAX_REASON_CHARS],
                finding_refs=findings,
            )

        key = f"sentence/{self._draft_id}/{index}/{revision}"
        await self._desk.ledger.record(version, key, f"sentence {index}, version {revision}")

    def _reviewed(self, audited: Sequence[_Tracked]) -> ReviewedReport:
        by_index = {t.index: t for t in audited}
        removed = {t.index for t in audited if t.status is SentenceStatus.REMOVED}
        # A revised text stands once revised, upheld, or left open (the text its objection was raised against).
        replaced = {t.index: t.text for t in audited if t.text != t.sentence.text}
        # A sentence no auditor judged (the review ran out of budget or time, its auditor failed, or it is past the
        # bound) says so where it stands, not only in the verification section: the review failed closed.
        for sentence in self._draft.cited():
            tracked = by_index.get(sentence.index)
            if tracked is None or tracked.status is SentenceStatus.UNAUDITED:
                replaced[sentence.index] = UNVERIFIED_MARK + replaced.get(sentence.index, sentence.text)
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
        for sentence in self._draft.sentences:
            if not sentence.cited and sentence.index not in by_index:
                continue  # prose that cites nothing and failed no check
            tracked = by_index.get(sentence.index)
            if tracked is None:  # past the bound on audited sentences
                findings = sentence.finding_sequence_nos[:MAX_FINDINGS_PER_SENTENCE]
                checks.append(SentenceCheck(sentence.index, sentence.text, findings, SentenceStatus.UNAUDITED))
                continue
            checks.append(
                SentenceCheck(tracked.index, tracked.text, tracked.findings, tracked.status, tuple(tracked.audits))
            )
        objections = tuple(self._objections[n] for n in sorted(self._objections))
        return ReviewedReport(report, tuple(checks), objections, self._rounds, self._reviser.usage)


async def _all(steps: Iterable[Coroutine[Any, Any, object]]) -> None:
    """Run `steps` at once; if one fails, the others are cancelled rather than left running past the run."""
    async with asyncio.TaskGroup() as group:
        for step in steps:
            group.create_task(step)
