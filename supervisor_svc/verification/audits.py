"""The review's blind roles, a citation auditor and an adjudicator: what each is asked, and what it answered.

An auditor sees the question, its one sentence (its markers naming the findings it cites) and those
findings, never the report's other sentences; an adjudicator sees one objection, its sentence and the
findings. Their outputs come back as ledger records the review reads here, and nothing else of theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import NamedTuple, TypeVar

from quarry.identity import Role
from quarry.records.base import RecordError
from quarry.records.research import SENTENCE_REF, Adjudication, CitationAudit, CitationJudgement, ResearchRecord
from quarry.records.verification import Verification
from quarry.vocabulary import DelegationResult
from supervisor_svc.runs.delegating import Contract

log = logging.getLogger(__name__)

Output = TypeVar("Output", bound=ResearchRecord)

# A contract names at most this many findings (a worker's bound on input refs, less one for an objection).
MAX_FINDINGS_PER_SENTENCE = 19
# The most of one sentence a prompt carries.
MAX_SENTENCE_CHARS = 2000

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


class SentenceAudit(NamedTuple):
    """An auditor's judgement of one sentence, as its entries on the ledger have it."""

    audit_sequence_no: int
    judgement: CitationJudgement
    objection_sequence_no: int  # 0: no objection was recorded
    objection: str


# What the blind roles are told about a finding beyond its claim, by its sequence number (finding_context).
FindingContext = Mapping[int, str]


def finding_context(verification: Verification) -> dict[int, str]:
    """For each finding: what its claim-verifier read (the claim stands on that passage, so a sentence the
    passage does not bear out is unsound whatever the finding says), and the contradiction it is a side of."""
    notes: dict[int, str] = {}
    for f in verification.findings:
        if f.quote_excerpt.strip():
            notes[f.finding_sequence_no] = (
                f" Finding {f.finding_sequence_no}'s claim-verifier read on {f.quote_url}: "
                f'"{f.quote_excerpt[:MAX_SENTENCE_CHARS]}".'
            )
    for c in verification.contradictions:
        for side in (c.finding_sequence_no, *c.contradicting_finding_sequence_nos):
            notes[side] = notes.get(side, "") + (
                f' Finding {side} is contested: {c.finding_url} says "{c.finding_excerpt[:MAX_SENTENCE_CHARS]}", '
                f'but {c.contradicting_url} says "{c.contradicting_excerpt[:MAX_SENTENCE_CHARS]}". A sentence '
                "citing it is sound only if it presents this disagreement, citing both sides, and states neither "
                "as fact."
            )
    return notes


def audit_contract(
    question: str, index: int, cited: str, findings: Sequence[int], revision: int, context: FindingContext
) -> Contract:
    """Sentence `index` (`cited`: its text with its markers naming findings) for a blind auditor, with each
    cited finding's context (what its verifier read, the contradiction it is a side of)."""
    heading = f"Audit sentence {index}" + (f" (revision {revision})" if revision else "")
    numbers = ", ".join(map(str, findings))
    objective = (
        f"{heading}\n\nThe research question: {question}\n\n"
        f'Sentence {index} of a draft report: "{cited[:MAX_SENTENCE_CHARS]}"\n\n'
        f"It cites findings {numbers} (scratchpad entries).{_context(findings, context)} "
        f"Submit your audit of sentence_index {index} with finding_refs [{numbers}]."
    )
    return Contract(Role.CITATION_AUDITOR, objective, AUDIT_CRITERIA, (*map(str, findings), f"{SENTENCE_REF}{index}"))


def adjudication_contract(
    question: str, objection: int, index: int, cited: str, findings: Sequence[int], context: FindingContext
) -> Contract:
    """Objection `objection`, raised against sentence `index` (`cited`), for a blind adjudicator, with each
    cited finding's context."""
    objective = (
        f"Adjudicate objection {objection}\n\nThe research question: {question}\n\n"
        f"Objection {objection} was raised against sentence {index} of a draft report: "
        f'"{cited[:MAX_SENTENCE_CHARS]}"\n\n'
        f"It cites findings {', '.join(map(str, findings))}.{_context(findings, context)} "
        f"Decide it with objection_ref {objection}."
    )
    refs = (str(objection), *map(str, findings))
    return Contract(Role.ADJUDICATOR, objective, ADJUDICATION_CRITERIA, refs)


def _context(findings: Sequence[int], context: FindingContext) -> str:
    return "".join(context[number] for number in findings if number in context)


def read_audit(result: DelegationResult | None, index: int) -> SentenceAudit | None:
    """The judgement of sentence `index` from an auditor's result; None when it failed, or judged some other
    sentence."""
    audit = _output(result, CitationAudit, "an auditor's output is no citation audit")
    if result is None or audit is None:
        return None
    judged = [sentence for sentence in audit.sentences if sentence.sentence_index == index]
    if not judged:
        return None
    # The worker records the objections right after the audit, in the audit's order.
    objected = [s.sentence_index for s in audit.sentences if s.judgement is not CitationJudgement.SOUND]
    after = sorted(n for n in result.promoted if n > result.output_sequence_no)
    objection = after[objected.index(index)] if index in objected and len(after) == len(objected) else 0
    return SentenceAudit(result.output_sequence_no, judged[0].judgement, objection, judged[0].objection)


def read_adjudication(result: DelegationResult | None, objection: int) -> tuple[int, Adjudication] | None:
    """The adjudication entry's number and the decision on `objection`; None when the adjudicator failed, or
    decided some other objection."""
    adjudication = _output(result, Adjudication, "an adjudicator's output is no adjudication")
    if result is None or adjudication is None or adjudication.objection_ref != objection:
        return None
    return result.output_sequence_no, adjudication


def _output(result: DelegationResult | None, record: type[Output], problem: str) -> Output | None:
    """The structured output a role recorded, when it succeeded with one of type `record` (else `problem` is
    logged, or nothing when it recorded none)."""
    if result is None or not result.succeeded or not result.output_sequence_no:
        return None
    try:
        output = record.parse(result.output_json)
    except RecordError as error:
        log.warning("%s: %s", problem, error)
        return None
    assert isinstance(output, record)
    return output
