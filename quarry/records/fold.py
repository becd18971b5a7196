"""A verified run's Verification as a pure fold of its research ledger: the thread's entries in, the state
`GetRun` serves out. The supervisor serves exactly this fold, and any reader of the ledger (`quarry runs
verify`, a client in another language) can compute it again and compare.

What each part is folded from:

- Findings: every researcher's finding with a quoted source, in thread order; the first
  MAX_VERIFIED_FINDINGS are verified. A finding's check is its first claim verdict, unless the supervisor
  recorded a ClaimRefusal for it: then it is unverified, for the refusal's reason. A supported verdict the
  supervisor did not accept is on the ledger as refused, so the ledger never reads "supported" where the
  run does not.
- Contradictions: each contradicted verdict that quotes a page, beside the finding's own quoted source,
  with the findings on the other side (those that quote that page).
- Sentences: each DraftSentence the review of the latest draft recorded (a run taken up during its review
  writes its report again, and reviews it again). A sentence's text is its latest version an audit judged
  (or as drafted); its status comes from its last objection's resolution, else from whether an audit judged
  it sound. Audits and objections count from the latest draft's first sentence on.
- Objections: every objection, with its last adjudication and its resolution.
- Revision rounds: the highest revision recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from quarry.identity import Role
from quarry.records.base import RecordError
from quarry.records.research import (
    Adjudication,
    CitationAudit,
    CitationJudgement,
    ClaimJudgement,
    ClaimRefusal,
    ClaimVerdict,
    DraftSentence,
    Objection,
    ObjectionResolution,
    ResearchRecord,
    Resolution,
    parse_record,
)
from quarry.records.verification import (
    Contradiction,
    FindingCheck,
    ObjectionState,
    ObjectionStatus,
    SentenceCheck,
    SentenceStatus,
    Verification,
)
from quarry.vocabulary import Entry, EntryKind

__all__ = [
    "MAX_VERIFIED_FINDINGS",
    "both_sides",
    "check_of",
    "contradiction_of",
    "fold_ledger",
    "sourced_findings",
    "unverified",
    "verified_findings",
]

# Findings verified per run, at most (each is a delegation); later ones stay unverified, never cited.
MAX_VERIFIED_FINDINGS = 50

_OBJECTION_STATUSES = {
    Resolution.REVISED: ObjectionStatus.REVISED,
    Resolution.DISMISSED: ObjectionStatus.DISMISSED,
    Resolution.SENTENCE_REMOVED: ObjectionStatus.SENTENCE_REMOVED,
    Resolution.APPROVED_BY_PERSON: ObjectionStatus.APPROVED_BY_PERSON,
}
_SENTENCE_STATUSES = {
    Resolution.REVISED: SentenceStatus.REVISED,
    Resolution.DISMISSED: SentenceStatus.UPHELD,
    Resolution.SENTENCE_REMOVED: SentenceStatus.REMOVED,
    Resolution.APPROVED_BY_PERSON: SentenceStatus.APPROVED_OVER_OBJECTION,
}


def sourced_findings(entries: Sequence[Entry]) -> list[Entry]:
    """The findings a report may cite: researchers' findings with at least one quoted source."""
    return [
        entry
        for entry in entries
        if entry.kind is EntryKind.FINDING
        and entry.author.role is Role.RESEARCHER
        and any(source.excerpt for source in entry.sources)
    ]


def verified_findings(entries: Sequence[Entry]) -> tuple[list[Entry], list[Entry]]:
    """The sourced findings that get a claim-verifier, and those past the bound that do not."""
    sourced = sourced_findings(entries)
    return sourced[:MAX_VERIFIED_FINDINGS], sourced[MAX_VERIFIED_FINDINGS:]


def check_of(finding: Entry, verdict_sequence_no: int, verdict: ClaimVerdict) -> FindingCheck:
    """The check a verdict the supervisor accepted makes of its finding."""
    return FindingCheck(
        finding.sequence_no,
        finding.content,
        verdict.judgement,
        verdict_sequence_no=verdict_sequence_no,
        rationale=verdict.rationale,
        quote_url=verdict.quote.url if verdict.quote else "",
        quote_excerpt=verdict.quote.excerpt if verdict.quote else "",
    )


def unverified(finding: Entry, reason: str) -> FindingCheck:
    return FindingCheck(finding.sequence_no, finding.content, None, rationale=reason)


def contradiction_of(finding: Entry, verdict_sequence_no: int, verdict: ClaimVerdict) -> Contradiction | None:
    """The disagreement between sources an accepted verdict found, if it judged the finding contradicted."""
    quoted = [source for source in finding.sources if source.excerpt]
    if verdict.judgement is not ClaimJudgement.CONTRADICTED or verdict.quote is None or not quoted:
        return None
    # The finding's side: its source on the page the verifier quoted, if it quoted one of them.
    own = next((source for source in quoted if source.url == verdict.quote.url), quoted[0])
    return Contradiction(
        finding_sequence_no=finding.sequence_no,
        claim=finding.content,
        finding_url=own.url,
        finding_excerpt=own.excerpt,
        contradicting_url=verdict.quote.url,
        contradicting_excerpt=verdict.quote.excerpt,
        rationale=verdict.rationale,
        verdict_sequence_no=verdict_sequence_no,
    )


def both_sides(contradiction: Contradiction, findings: Sequence[Entry]) -> Contradiction:
    """The contradiction with its other side: the findings that quote the page that says otherwise."""
    others = tuple(
        finding.sequence_no
        for finding in findings
        if finding.sequence_no != contradiction.finding_sequence_no
        and any(source.url == contradiction.contradicting_url and source.excerpt for source in finding.sources)
    )
    return replace(contradiction, contradicting_finding_sequence_nos=others)


def fold_ledger(entries: Sequence[Entry]) -> Verification:
    """The Verification a verified run's thread holds (`entries`: all of them, in order)."""
    ledger = _Ledger.read(entries)
    findings, beyond = verified_findings(entries)
    checks: list[FindingCheck] = []
    contradictions: list[Contradiction] = []
    for finding in findings + beyond:
        number = finding.sequence_no
        refusal = ledger.refusals.get(number)
        verdict = ledger.verdicts.get(number)
        if refusal is not None:
            checks.append(unverified(finding, refusal.reason))
        elif verdict is not None and finding in findings:
            checks.append(check_of(finding, *verdict))
            if (contradiction := contradiction_of(finding, *verdict)) is not None:
                contradictions.append(both_sides(contradiction, findings))
        else:
            checks.append(unverified(finding, "not verified: no verdict is recorded"))
    return Verification(
        enabled=True,
        findings=tuple(checks),
        sentences=ledger.sentences(),
        objections=ledger.objections(),
        contradictions=tuple(contradictions),
        revision_rounds=max((s.revision for s in ledger.drafts), default=0),
    )


@dataclass
class _Ledger:
    """The thread's research records, read once."""

    verdicts: dict[int, tuple[int, ClaimVerdict]] = field(default_factory=dict)  # the first, by finding
    refusals: dict[int, ClaimRefusal] = field(default_factory=dict)
    drafts: list[DraftSentence] = field(default_factory=list)
    current: dict[int, DraftSentence] = field(default_factory=dict)  # each sentence's latest judged version
    audits: dict[int, list[tuple[int, CitationJudgement]]] = field(default_factory=dict)  # by sentence
    raised: dict[int, Objection] = field(default_factory=dict)  # by entry number, in order
    adjudications: dict[int, int] = field(default_factory=dict)  # objection: its last adjudication
    resolutions: dict[int, tuple[int, ObjectionResolution]] = field(default_factory=dict)  # objection: its first

    @classmethod
    def read(cls, entries: Sequence[Entry]) -> _Ledger:
        ledger = cls()
        latest: dict[int, DraftSentence] = {}  # each sentence's latest version, judged or not
        draft: str | None = None  # the draft under review: a new one starts the review over
        for entry in entries:
            record = _record(entry)
            number = entry.sequence_no
            if isinstance(record, DraftSentence) and entry.author.role is Role.SUPERVISOR and record.draft != draft:
                if draft is not None:  # the report was written again: what the earlier draft's review did is void
                    ledger.drafts, ledger.current, ledger.audits, ledger.raised = [], {}, {}, {}
                    latest = {}
                draft = record.draft
            if isinstance(record, ClaimVerdict) and entry.author.role is Role.VERIFIER:
                ledger.verdicts.setdefault(record.finding_ref, (number, record))
            elif isinstance(record, ClaimRefusal) and entry.author.role is Role.SUPERVISOR:
                ledger.refusals.setdefault(record.finding_ref, record)
            elif isinstance(record, DraftSentence) and entry.author.role is Role.SUPERVISOR:
                ledger.drafts.append(record)
                latest[record.sentence_index] = record
                if record.revision == 0:
                    ledger.current.setdefault(record.sentence_index, record)
            elif isinstance(record, CitationAudit):
                for judged in record.sentences:
                    index = judged.sentence_index
                    ledger.audits.setdefault(index, []).append((number, judged.judgement))
                    if index in latest:
                        ledger.current[index] = latest[index]
            elif isinstance(record, Objection):
                ledger.raised[number] = record
            elif isinstance(record, Adjudication):
                ledger.adjudications[record.objection_ref] = number
            elif isinstance(record, ObjectionResolution) and entry.author.role is Role.SUPERVISOR:
                ledger.resolutions.setdefault(record.objection_ref, (number, record))
        return ledger

    def objections(self) -> tuple[ObjectionState, ...]:
        states = []
        for number, objection in self.raised.items():
            resolved = self.resolutions.get(number)
            states.append(
                ObjectionState(
                    number,
                    objection.sentence_index,
                    objection.reason,
                    _OBJECTION_STATUSES[resolved[1].resolution] if resolved else ObjectionStatus.OPEN,
                    adjudication_sequence_no=self.adjudications.get(number, 0),
                    resolution_sequence_no=resolved[0] if resolved else 0,
                )
            )
        return tuple(states)

    def sentences(self) -> tuple[SentenceCheck, ...]:
        checks = []
        for index in sorted(self.current):
            version = self.current[index]
            audits = self.audits.get(index, [])
            objections = [n for n, objection in self.raised.items() if objection.sentence_index == index]
            if objections:
                resolved = self.resolutions.get(objections[-1])
                status = _SENTENCE_STATUSES[resolved[1].resolution] if resolved else SentenceStatus.OBJECTED
            elif any(judgement is CitationJudgement.SOUND for _, judgement in audits):
                status = SentenceStatus.SOUND
            else:
                status = SentenceStatus.UNAUDITED
            checks.append(SentenceCheck(index, version.text, version.finding_refs, status, tuple(n for n, _ in audits)))
        return tuple(checks)


def _record(entry: Entry) -> ResearchRecord | None:
    """The research record an entry holds; None for other kinds, and for a verdict written as prose."""
    try:
        return parse_record(entry.kind, entry.content)
    except RecordError:
        return None
