"""The sections the code, not the model, writes under a verified report: how each claim was verified,
and where sources disagree. Deterministic: the same Verification and citations give the same Markdown.

Text quoted here loses its citation markers, so the report's citations stay those of its own body.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from quarry.records.research import ClaimJudgement
from quarry.records.verification import (
    ObjectionState,
    SentenceCheck,
    SentenceStatus,
    Verification,
)
from supervisor_svc.runs.domain import Citation, Report
from supervisor_svc.verification.sentences import MARKER

VERIFIED_HEADING = "## How each claim was verified"
DISAGREEMENT_HEADING = "## Where sources disagree"
_MAX_QUOTED_CHARS = 300
_CITATION = re.compile(r"[ \t]*" + MARKER.pattern)

_JUDGEMENTS = {
    ClaimJudgement.SUPPORTED: "supported",
    ClaimJudgement.PARTIALLY_SUPPORTED: "partially supported",
    ClaimJudgement.UNSUPPORTED: "unsupported",
    ClaimJudgement.CONTRADICTED: "contradicted",
}
_STATUSES = {
    SentenceStatus.SOUND: "audited sound",
    SentenceStatus.REVISED: "revised after an objection, then audited sound",
    SentenceStatus.UPHELD: "kept as written: an adjudicator dismissed the objection",
    SentenceStatus.REMOVED: "removed from the report",
    SentenceStatus.UNAUDITED: "not audited: no auditor could judge it",
    SentenceStatus.OBJECTED: "objected to: the objection is still open",
    SentenceStatus.APPROVED_OVER_OBJECTION: (
        "not supported: the review left the objection open, and a person approved the run over it"
    ),
}


def verification_sections(verification: Verification, citations: Sequence[Citation]) -> str:
    """The Markdown appended to a verified report ("" when the run was not verified)."""
    if not verification.enabled:
        return ""
    parts = [VERIFIED_HEADING, _counts(verification)]
    if citations:
        parts.append(
            "Each source below was re-read by a blind claim verifier, who judged the finding it backs:\n\n"
            + "\n".join(_source_line(citation, verification) for citation in sorted(citations, key=_number))
        )
    if verification.sentences:
        parts.append(
            "Each sentence the review checked, by a blind citation auditor against the findings it cites or by "
            "the citation checks of the code:\n\n"
            + "\n".join(_sentence_line(sentence, verification) for sentence in verification.sentences)
        )
    if verification.contradictions:
        parts.append(DISAGREEMENT_HEADING)
        parts.append(
            "\n".join(
                f"- Finding {c.finding_sequence_no} claims {_quoted(c.claim)}, citing {c.finding_url}: "
                f"{_quoted(c.finding_excerpt)}. But {c.contradicting_url} says {_quoted(c.contradicting_excerpt)}"
                + (f" ({_plain(c.rationale)})" if c.rationale.strip() else "")
                for c in sorted(verification.contradictions, key=lambda c: c.finding_sequence_no)
            )
        )
    return "\n\n".join(parts) + "\n"


def with_verification(report: Report, verification: Verification) -> Report:
    """The final report: the reviewed text, then the sections above (the report as it was when not verified)."""
    sections = verification_sections(verification, report.citations)
    if not sections:
        return report
    body = report.markdown.rstrip()
    return replace(report, markdown=f"{body}\n\n{sections}" if body else sections)


def without_verification(report: Report, verification: Verification) -> Report:
    """The reviewed report `with_verification` made this one from (given the same verification)."""
    sections = verification_sections(verification, report.citations)
    markdown = report.markdown
    if sections and markdown.endswith(sections):
        markdown = markdown[: -len(sections)].rstrip("\n")
    return replace(report, markdown=markdown)


def _number(citation: Citation) -> int:
    return citation.number


def _counts(verification: Verification) -> str:
    rounds = verification.revision_rounds
    revised = f" in {rounds} revision round{'s' if rounds != 1 else ''}" if rounds else ""
    return (
        f"{verification.supported_claims} claims supported, {verification.removed_claims} removed{revised}, "
        f"{verification.contested_claims} contested by another source."
    )


def _source_line(citation: Citation, verification: Verification) -> str:
    name = _plain(citation.title) or citation.url
    check = next((f for f in verification.findings if f.finding_sequence_no == citation.sequence_no), None)
    if check is None or check.judgement is None:
        return f"- [{citation.number}] {name} (finding {citation.sequence_no}): not verified"
    line = f"- [{citation.number}] {name} (finding {citation.sequence_no}): {_JUDGEMENTS[check.judgement]}"
    if check.quote_excerpt.strip():
        line += f"; the verifier read {_quoted(check.quote_excerpt)}"
    if check.rationale.strip():
        line += f" ({_plain(check.rationale)})"
    return line


def _sentence_line(sentence: SentenceCheck, verification: Verification) -> str:
    numbers = sentence.finding_sequence_nos
    findings = f"finding{'s' if len(numbers) != 1 else ''} {', '.join(map(str, numbers))}"
    objections = [o for o in verification.objections if o.sentence_index == sentence.sentence_index]
    line = f"- {_quoted(sentence.text)} ({findings}): {_STATUSES[sentence.status]}"
    if sentence.status is not SentenceStatus.SOUND and objections:
        line += "; " + "; ".join(_objection(o) for o in objections)
    return line


def _objection(objection: ObjectionState) -> str:
    return f"objection {objection.objection_sequence_no}: {_plain(objection.reason)}"


def _plain(text: str) -> str:
    """One line without citation markers, cut to a readable length."""
    flat = " ".join(_CITATION.sub("", text).split())
    return flat if len(flat) <= _MAX_QUOTED_CHARS else flat[: _MAX_QUOTED_CHARS - 1].rstrip() + "\u2026"


def _quoted(text: str) -> str:
    return f"\u201c{_plain(text)}\u201d"
