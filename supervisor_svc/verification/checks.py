"""The citation checks the supervisor's code makes of a draft, before any model judges it.

Two things are wrong whatever an auditor would say: a sentence that cited a source number naming no citable
finding (the citation filter cut the marker, so the sentence may now stand uncited), and a sentence that
cites one side of a contradiction between sources without the other (it states a disputed claim as fact).
Each raises an objection of its own (quarry.records.research.CitationCheck); the review then treats it like
an auditor's, except that no adjudicator can dismiss it: only a revision that passes the check, and its
audit, settles it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from quarry.records.research import CitationCheck
from supervisor_svc.verification.sentences import Draft, Sentence


class Flag(NamedTuple):
    check: CitationCheck
    reason: str


Contested = Mapping[int, frozenset[int]]  # each contested finding, with the findings on the other side


def flag_draft(draft: Draft, invalid_at: Sequence[int], contested: Contested) -> dict[int, Flag]:
    """The draft's sentences that fail a check, by index: a cut marker (`invalid_at`: offsets in the
    draft's markdown where the citation filter cut one), or a one-sided citation of a contested finding."""
    flags: dict[int, Flag] = {}
    for offset in invalid_at:
        sentence = _sentence_at(draft.sentences, draft.markdown, offset)
        if sentence is not None and sentence.index not in flags:
            uncited = "" if sentence.cited else "; it is left with no citation"
            flags[sentence.index] = Flag(
                CitationCheck.INVALID_MARKER, f"it cited a source number that names no verified finding{uncited}"
            )
    for sentence in draft.sentences:
        if sentence.index not in flags and (reason := one_sided(sentence.finding_sequence_nos, contested)):
            flags[sentence.index] = Flag(CitationCheck.ONE_SIDED, reason)
    return flags


def one_sided(findings: Sequence[int], contested: Contested) -> str:
    """Why citing `findings` states a disputed claim as fact ("" when it does not): a contested finding is
    cited without any finding on the other side of its contradiction."""
    cited = set(findings)
    for finding in findings:
        others = contested.get(finding)
        if others and not others & cited:
            sides = ", ".join(map(str, sorted(others)))
            return (
                f"it cites finding {finding}, whose source is contradicted by that of finding {sides}, without "
                "citing the other side: a disputed claim is stated as fact, not as a disagreement between sources"
            )
    return ""


def _sentence_at(sentences: Sequence[Sentence], markdown: str, offset: int) -> Sentence | None:
    """The sentence a cut marker at `offset` belonged to: the one it sits in, else the one it followed on the
    same line (markers come after their sentence), else the one right after it on the same line. None when no
    sentence shares its line (a cut in a code block, or on a line of its own)."""
    before = after = None
    for sentence in sentences:
        if sentence.start <= offset <= sentence.end:
            return sentence
        if sentence.end < offset:
            before = sentence
        elif after is None:
            after = sentence
    if before is not None and not markdown[before.end : offset].strip(" \t"):
        return before
    if after is not None and not markdown[offset : after.start].strip(" \t"):
        return after
    return None
