"""The code-written sections under a verified report: how each claim was verified, where sources disagree."""

from __future__ import annotations

from quarry.records.research import ClaimJudgement
from quarry.records.verification import (
    NOT_VERIFIED,
    Contradiction,
    FindingCheck,
    ObjectionState,
    ObjectionStatus,
    SentenceCheck,
    SentenceStatus,
    Verification,
)
from supervisor_svc.runs.domain import Citation, Report
from supervisor_svc.verification.report import verification_sections, with_verification

CITATIONS = (
    Citation(2, "https://b.example", "", "three hundred workers", 13),
    Citation(1, "https://a.example", "Building the tower", "opened in May 1889", 12),
)
VERIFICATION = Verification(
    enabled=True,
    findings=(
        FindingCheck(
            12,
            "It opened in 1889.",
            ClaimJudgement.SUPPORTED,
            20,
            "The page says so.",
            "https://a.example",
            "opened\nin May 1889",
        ),
        FindingCheck(13, "300 workers built it.", None),
        FindingCheck(
            14,
            "It is 300 m tall.",
            ClaimJudgement.CONTRADICTED,
            22,
            "The page says 330.",
            "https://c.example",
            "330 metres",
        ),
    ),
    sentences=(
        SentenceCheck(1, "It opened in 1889 [1].", (12,), SentenceStatus.SOUND, (30,)),
        SentenceCheck(2, "Three hundred workers built it [2].", (13,), SentenceStatus.REVISED, (31, 40)),
        SentenceCheck(4, "It was painted gold [1].", (12,), SentenceStatus.REMOVED, (33,)),
        SentenceCheck(5, "It is old [1].", (12,), SentenceStatus.UNAUDITED),
    ),
    objections=(
        ObjectionState(32, 2, "Cites the opening, not the workers.", ObjectionStatus.REVISED, 0, 41),
        ObjectionState(34, 4, "No finding mentions gold [1].", ObjectionStatus.SENTENCE_REMOVED, 35, 42),
    ),
    contradictions=(
        Contradiction(
            14,
            "It is 300 m tall.",
            "https://b.example",
            "300 m",
            "https://c.example",
            "330 metres",
            "Heights differ.",
            22,
        ),
    ),
    revision_rounds=1,
)

EXPECTED = "\n".join(
    [
        "## How each claim was verified",
        "",
        "2 claims supported, 1 removed in 1 revision round, 1 contested by another source.",
        "",
        "Each source below was re-read by a blind claim verifier, who judged the finding it backs:",
        "",
        "- [1] Building the tower (finding 12): supported;"
        " the verifier read \u201copened in May 1889\u201d (The page says so.)",
        "- [2] https://b.example (finding 13): not verified",
        "",
        "Each sentence the review checked, by a blind citation auditor against the findings it cites or by the "
        "citation checks of the code:",
        "",
        "- \u201cIt opened in 1889.\u201d (finding 12): audited sound",
        "- \u201cThree hundred workers built it.\u201d (finding 13): revised after an objection, then audited sound"
        "; objection 32: Cites the opening, not the workers.",
        "- \u201cIt was painted gold.\u201d (finding 12): removed from the report"
        "; objection 34: No finding mentions gold.",
        "- \u201cIt is old.\u201d (finding 12): not audited: no auditor could judge it",
        "",
        "## Where sources disagree",
        "",
        "- Finding 14 claims \u201cIt is 300 m tall.\u201d, citing https://b.example: \u201c300 m\u201d."
        " But https://c.example says \u201c330 metres\u201d (Heights differ.)",
        "",
    ]
)


def test_the_sections_say_how_each_claim_was_verified_and_where_sources_disagree() -> None:
    assert verification_sections(VERIFICATION, CITATIONS) == EXPECTED


def test_an_unverified_run_gets_no_sections_and_no_contradiction_no_disagreement_section() -> None:
    assert verification_sections(NOT_VERIFIED, CITATIONS) == ""
    quiet = Verification(enabled=True, findings=VERIFICATION.findings[:2])
    text = verification_sections(quiet, CITATIONS)
    assert text.startswith("## How each claim was verified\n\n0 claims supported, 0 removed, 0 contested")
    assert "Where sources disagree" not in text and "citation auditor" not in text


def test_the_final_report_is_the_reviewed_text_then_the_sections() -> None:
    reviewed = Report("# Tower\n\nIt opened in 1889 [1].\n\n", CITATIONS, removed_citations=2)
    final = with_verification(reviewed, VERIFICATION)
    assert final.markdown == "# Tower\n\nIt opened in 1889 [1].\n\n" + EXPECTED
    assert (final.citations, final.removed_citations) == (CITATIONS, 2)
    assert with_verification(reviewed, NOT_VERIFIED) is reviewed
