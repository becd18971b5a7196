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
from quarry.records.research import Adjudication, CitationAudit, CitationJudgement, ResearchRecord
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


# What a blind claim-verifier read on a finding's page when it judged the finding: its URL and its quote.
VerifierQuotes = Mapping[int, tuple[str, str]]


def audit_contract(
    question: str, index: int, cited: str, findings: Sequence[int], revision: int, quotes: VerifierQuotes
) -> Contract:
    """Sentence `index` (`cited`: its text with its markers naming findings) for a blind auditor, with what
    each cited finding's verifier read."""
    heading = f"Audit sentence {index}" + (f" (revision {revision})" if revision else "")
    numbers = ", ".join(map(str, findings))
    objective = (
        f"{heading}\n\nThe research question: {question}\n\n"
        f'Sentence {index} of a draft report: "{cited[:MAX_SENTENCE_CHARS]}"\n\n'
        f"It cites findings {numbers} (scratchpad entries).{_verifier_quotes(findings, quotes)} "
        f"Submit your audit of sentence_index {index} with finding_refs [{numbers}]."
    )
    return Contract(Role.CITATION_AUDITOR, objective, AUDIT_CRITERIA, tuple(map(str, findings)))


def adjudication_contract(
    question: str, objection: int, index: int, cited: str, findings: Sequence[int], quotes: VerifierQuotes
) -> Contract:
    """Objection `objection`, raised against sentence `index` (`cited`), for a blind adjudicator, with what
    each cited finding's verifier read."""
    objective = (
        f"Adjudicate objection {objection}\n\nThe research question: {question}\n\n"
        f"Objection {objection} was raised against sentence {index} of a draft report: "
        f'"{cited[:MAX_SENTENCE_CHARS]}"\n\n'
        f"It cites findings {', '.join(map(str, findings))}.{_verifier_quotes(findings, quotes)} "
        f"Decide it with objection_ref {objection}."
    )
    refs = (str(objection), *map(str, findings))
    return Contract(Role.ADJUDICATOR, objective, ADJUDICATION_CRITERIA, refs)


def _verifier_quotes(findings: Sequence[int], quotes: VerifierQuotes) -> str:
    """What the cited findings' verifiers read, as a sentence per finding ("" when none is known): the claim
    stands on that passage, so a sentence the passage does not bear out is unsound whatever the finding says."""
    said = [
        f' Finding {number}\'s claim-verifier read on {quotes[number][0]}: "{quotes[number][1][:MAX_SENTENCE_CHARS]}".'
        for number in findings
        if number in quotes and quotes[number][1].strip()
    ]
    return "".join(said)


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
