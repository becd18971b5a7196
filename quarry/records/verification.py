"""A run's verification as the client sees it: each finding's verdict, each cited sentence's audit,
the objections and how they ended, the contradictions between sources, and the counts.

Plain frozen values, free of protos and SQL: `quarry.records.fold` folds them from a run's ledger, the
supervisor's store keeps them as JSON, and `quarry.convert.verification_to_proto` makes the quarry.v1
message GetRun serves.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, replace
from typing import Any

from quarry.records.research import ClaimJudgement

__all__ = [
    "CITABLE",
    "NOT_VERIFIED",
    "Contradiction",
    "FindingCheck",
    "ObjectionState",
    "ObjectionStatus",
    "SentenceCheck",
    "SentenceStatus",
    "Verification",
]


class SentenceStatus(enum.StrEnum):
    SOUND = "sound"
    REVISED = "revised"
    UPHELD = "upheld"  # kept as written: an adjudicator dismissed the objection
    REMOVED = "removed"
    UNAUDITED = "unaudited"  # no auditor could judge it
    OBJECTED = "objected"  # an objection is still open (only while a run awaits approval)
    # Kept as written with its objection unsettled: a person approved the run over it. Never supported.
    APPROVED_OVER_OBJECTION = "approved_over_objection"

    @property
    def in_report(self) -> bool:
        return self is not SentenceStatus.REMOVED

    @property
    def supported(self) -> bool:
        """Verification stands behind it."""
        return self in (SentenceStatus.SOUND, SentenceStatus.REVISED, SentenceStatus.UPHELD)


class ObjectionStatus(enum.StrEnum):
    OPEN = "open"
    REVISED = "revised"
    DISMISSED = "dismissed"
    SENTENCE_REMOVED = "sentence_removed"
    APPROVED_BY_PERSON = "approved_by_person"  # left open by the review, then approved over by a person


# Judgements that let the report cite a finding.
CITABLE = frozenset({ClaimJudgement.SUPPORTED, ClaimJudgement.PARTIALLY_SUPPORTED})


@dataclass(frozen=True)
class FindingCheck:
    finding_sequence_no: int
    claim: str
    judgement: ClaimJudgement | None  # None: unverified (the verifier failed, or the budget was spent)
    verdict_sequence_no: int = 0
    rationale: str = ""
    quote_url: str = ""
    quote_excerpt: str = ""

    @property
    def citable(self) -> bool:
        return self.judgement in CITABLE


@dataclass(frozen=True)
class SentenceCheck:
    sentence_index: int
    text: str
    finding_sequence_nos: tuple[int, ...]
    status: SentenceStatus
    audit_sequence_nos: tuple[int, ...] = ()


@dataclass(frozen=True)
class ObjectionState:
    objection_sequence_no: int
    sentence_index: int
    reason: str
    status: ObjectionStatus = ObjectionStatus.OPEN
    adjudication_sequence_no: int = 0
    resolution_sequence_no: int = 0


@dataclass(frozen=True)
class Contradiction:
    finding_sequence_no: int
    claim: str
    finding_url: str
    finding_excerpt: str
    contradicting_url: str
    contradicting_excerpt: str
    rationale: str
    verdict_sequence_no: int
    # The run's other findings that cite the contradicting page: the other side of the disagreement.
    contradicting_finding_sequence_nos: tuple[int, ...] = ()


@dataclass(frozen=True)
class Verification:
    enabled: bool = False
    findings: tuple[FindingCheck, ...] = ()
    sentences: tuple[SentenceCheck, ...] = ()
    objections: tuple[ObjectionState, ...] = ()
    contradictions: tuple[Contradiction, ...] = ()
    revision_rounds: int = 0

    @property
    def supported_claims(self) -> int:
        return sum(1 for sentence in self.sentences if sentence.status.supported)

    @property
    def removed_claims(self) -> int:
        return sum(1 for sentence in self.sentences if sentence.status is SentenceStatus.REMOVED)

    @property
    def contested_claims(self) -> int:
        return len(self.contradictions)

    @property
    def open_objections(self) -> tuple[ObjectionState, ...]:
        return tuple(o for o in self.objections if o.status is ObjectionStatus.OPEN)

    def contested(self) -> dict[int, frozenset[int]]:
        """Both sides of every contradiction: each contested finding, with the findings on the other side."""
        sides: dict[int, set[int]] = {}
        for c in self.contradictions:
            for other in c.contradicting_finding_sequence_nos:
                sides.setdefault(c.finding_sequence_no, set()).add(other)
                sides.setdefault(other, set()).add(c.finding_sequence_no)
        return {finding: frozenset(others) for finding, others in sides.items()}

    def citable_findings(self) -> frozenset[int]:
        """What the report may cite: the supported findings, and both sides of a contradiction whose other side
        is a finding too (contested: only in a sentence that cites the other side as well, presenting the
        disagreement). A finding judged contradicted is citable only when a supported finding quotes the page
        that says otherwise: else no sentence could present both sides."""
        supported = frozenset(f.finding_sequence_no for f in self.findings if f.citable)
        contested = self.contested()
        return supported | frozenset(
            f.finding_sequence_no
            for f in self.findings
            if f.judgement is ClaimJudgement.CONTRADICTED
            and contested.get(f.finding_sequence_no, frozenset()) & supported
        )

    def contested_findings(self) -> frozenset[int]:
        return frozenset(self.contested())

    def judgement_of(self, finding_sequence_no: int) -> ClaimJudgement | None:
        for finding in self.findings:
            if finding.finding_sequence_no == finding_sequence_no:
                return finding.judgement
        return None

    def with_objections(self, objections: tuple[ObjectionState, ...]) -> Verification:
        return replace(self, objections=objections)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verification:
        return cls(
            enabled=bool(data.get("enabled", False)),
            findings=tuple(
                FindingCheck(**{**f, "judgement": ClaimJudgement(f["judgement"]) if f.get("judgement") else None})
                for f in data.get("findings", [])
            ),
            sentences=tuple(
                SentenceCheck(
                    **{
                        **s,
                        "finding_sequence_nos": tuple(s.get("finding_sequence_nos", ())),
                        "audit_sequence_nos": tuple(s.get("audit_sequence_nos", ())),
                        "status": SentenceStatus(s["status"]),
                    }
                )
                for s in data.get("sentences", [])
            ),
            objections=tuple(
                ObjectionState(**{**o, "status": ObjectionStatus(o["status"])}) for o in data.get("objections", [])
            ),
            contradictions=tuple(
                Contradiction(
                    **{
                        **c,
                        "contradicting_finding_sequence_nos": tuple(c.get("contradicting_finding_sequence_nos", ())),
                    }
                )
                for c in data.get("contradictions", [])
            ),
            revision_rounds=int(data.get("revision_rounds", 0)),
        )


NOT_VERIFIED = Verification()
