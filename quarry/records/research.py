"""The research ledger's records: what each evidence role emits, and what the supervisor logs about them.

One schema for both sides. A worker running a claim-verifier, citation auditor or adjudicator checks the
role's output against these models before it records anything; the supervisor folds the entries back with
`parse_record`. Each record is the JSON `content` of one scratchpad entry, of the kind its `entry_kind`
names (RECORD_TYPES maps them), so the ledger is the run's thread: immutable, typed, gap-free.

Every record is a `quarry.records.base.Record`: frozen, strict (JSON numbers stay numbers), carrying its `kind`
and `schema_version`, under the base's forward-compatibility policy. `parse_record` is the strict admission
the output gate and the scratchpad apply; `model_dump_json()` and `parse_record` round-trip exactly.

References: a scratchpad entry is named by its sequence number; in a contract's input refs (the
ResearchTask's `input_refs`) it is written in decimal ("12"), a page by its URL. InputRefs reads them.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from quarry.identity import Role
from quarry.records.base import Record, RecordError
from quarry.vocabulary import EntryKind, Tier

__all__ = [
    "PREVIEW_CHARS",
    "RECORD_TYPES",
    "SENTENCE_REF",
    "TASK_KINDS",
    "Adjudication",
    "AdjudicationDecision",
    "Assignment",
    "BibliographicJudgement",
    "BibliographicVerdict",
    "Candidate",
    "CandidateSources",
    "CatalogRecord",
    "CitationAudit",
    "CitationCheck",
    "CitationJudgement",
    "ClaimJudgement",
    "ClaimRefusal",
    "ClaimVerdict",
    "DraftSentence",
    "EvidenceKind",
    "Extract",
    "ExtractedEvidence",
    "InputRefs",
    "Objection",
    "ObjectionResolution",
    "ResearchRecord",
    "Resolution",
    "RouteDecision",
    "SentenceAudit",
    "TaskKind",
    "UsageObserved",
    "VerifiedQuote",
    "entry_preview",
    "parse_record",
]

# How a contract names a report sentence among its input refs: "sentence:3".
SENTENCE_REF = "sentence:"
# Bounds keep one record well inside the scratchpad's content limit (64 KiB by default).
_MAX_TEXT = 4000
_MAX_EXCERPT = 2000
_MAX_URL = 2048
_MAX_REFS = 20
_MAX_SENTENCES = 50
_URL_SCHEMES = ("http://", "https://", "corpus://")


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    if "\x00" in value:  # PostgreSQL cannot store NUL
        raise ValueError("must not contain NUL characters")
    return value


def _url(value: str) -> str:
    if not value.startswith(_URL_SCHEMES) or any(c.isspace() for c in value):
        raise ValueError("must be an http(s):// or corpus:// URL without spaces")
    return value


Text = Annotated[str, StringConstraints(min_length=1, max_length=_MAX_TEXT), AfterValidator(_text)]
Excerpt = Annotated[str, StringConstraints(min_length=1, max_length=_MAX_EXCERPT), AfterValidator(_text)]
Url = Annotated[str, StringConstraints(min_length=1, max_length=_MAX_URL), AfterValidator(_url)]
# A printable id without spaces (a delegation id, a worker id), as quarry.ids has them.
Identifier = Annotated[str, StringConstraints(pattern=r"^[\x21-\x7e]{1,256}$")]
EntryRef = Annotated[int, Field(ge=1, description="a scratchpad entry's sequence number")]
SentenceIndex = Annotated[int, Field(ge=0, description="the sentence's position in the draft report, from 0")]
Count = Annotated[int, Field(ge=0)]


class ResearchRecord(Record):
    """The base of every ledger record. Subclasses fix `kind` (a Literal) and `entry_kind`."""

    entry_kind: ClassVar[EntryKind]

    @classmethod
    def record_kind(cls) -> str:
        """The `kind` every record of this type carries, e.g. "claim_verdict"."""
        kind = cls.model_fields["kind"].default
        assert isinstance(kind, str)
        return kind

    def referenced_kinds(self) -> dict[int, EntryKind]:
        """The scratchpad entries this record refers to, each with the kind it must be (the scratchpad refuses a
        record whose references name no entry, or an entry of another kind)."""
        return {}

    def cited_entries(self) -> frozenset[int]:
        """The scratchpad entries this record refers to."""
        return frozenset(self.referenced_kinds())

    def cited_urls(self) -> frozenset[str]:
        """The pages this record refers to."""
        return frozenset()

    def judged_sentences(self) -> frozenset[int]:
        """The report sentences this record judges, by index."""
        return frozenset()

    def headline(self) -> str:
        """The record in a few words, for a person following the run (a delegation's summary, a live view)."""
        return self.record_kind().replace("_", " ")


def _short(text: str, chars: int = 80) -> str:
    """Text on one line, cut at a word to at most `chars`."""
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else flat[:chars].rsplit(" ", 1)[0] + "…"


def _delegation(delegation_id: str) -> str:
    """A delegation by the part of its id its run does not share: "d1" for "run-5f3….1.d1"."""
    return delegation_id.split(".")[-1] if delegation_id.startswith("run-") else delegation_id


# -- what the evidence roles emit ----------------------------------------------------------------------


class ClaimJudgement(enum.StrEnum):
    SUPPORTED = "supported"
    PARTIALLY_SUPPORTED = "partially_supported"
    UNSUPPORTED = "unsupported"
    # The source says otherwise: reported as a disagreement between sources, not hidden.
    CONTRADICTED = "contradicted"


class VerifiedQuote(BaseModel):
    """Words the verifier itself read on a page, quoted exactly."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    url: Url = Field(description="the page, exactly as read")
    excerpt: Excerpt = Field(description="words quoted verbatim from that page")


class ClaimVerdict(ResearchRecord):
    """A claim-verifier's judgement of one finding, recorded as an ENTRY_KIND_VERDICT entry."""

    entry_kind: ClassVar[EntryKind] = EntryKind.VERDICT

    kind: Literal["claim_verdict"] = "claim_verdict"
    finding_ref: EntryRef = Field(description="the sequence number of the finding judged")
    judgement: ClaimJudgement
    quote: VerifiedQuote | None = Field(
        default=None,
        description="the passage the judgement rests on, read by the verifier itself; required unless unsupported",
    )
    rationale: Text = Field(description="why the passage supports, partly supports, fails or contradicts the claim")

    @model_validator(mode="after")
    def _quote_backs_the_judgement(self) -> ClaimVerdict:
        if self.quote is None and self.judgement is not ClaimJudgement.UNSUPPORTED:
            raise ValueError(f"a {self.judgement.value} verdict quotes the passage it rests on (quote)")
        return self

    def referenced_kinds(self) -> dict[int, EntryKind]:
        return {self.finding_ref: EntryKind.FINDING}

    def cited_urls(self) -> frozenset[str]:
        return frozenset({self.quote.url}) if self.quote else frozenset()

    def headline(self) -> str:
        return f"finding {self.finding_ref}: {self.judgement.value}"


class CitationJudgement(enum.StrEnum):
    SOUND = "sound"
    UNSOUND = "unsound"
    NEEDS_REVISION = "needs_revision"


class SentenceAudit(BaseModel):
    """One cited sentence of the draft report, judged against the findings it cites."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    sentence_index: SentenceIndex
    finding_refs: tuple[EntryRef, ...] = Field(
        min_length=1, max_length=_MAX_REFS, description="the findings the sentence cites"
    )
    judgement: CitationJudgement
    objection: str = Field(
        default="", max_length=_MAX_TEXT, description="what is wrong with the sentence; required unless sound"
    )

    @model_validator(mode="after")
    def _objection_when_not_sound(self) -> SentenceAudit:
        if self.judgement is CitationJudgement.SOUND:
            if self.objection:
                raise ValueError("a sound sentence raises no objection (leave objection empty)")
        elif not self.objection.strip():
            raise ValueError(f"a sentence judged {self.judgement.value} says what is wrong with it (objection)")
        elif "\x00" in self.objection:
            raise ValueError("objection must not contain NUL characters")
        return self


class CitationCheck(enum.StrEnum):
    """A check the supervisor's code makes of a draft's citations, whose failure raises an objection itself:
    no model judges it, so no adjudicator can dismiss it."""

    # The sentence cited a source number that names no citable finding (the marker was cut from the text).
    INVALID_MARKER = "invalid_marker"
    # The sentence cites one side of a contradiction between sources without the other.
    ONE_SIDED = "one_sided"


class Objection(ResearchRecord):
    """A sentence that must not stand as written: raised from an audit (an auditor's, judged unsound or
    needing revision) or by a citation check of the supervisor's code. Open until revised, adjudicated or the
    sentence is removed."""

    entry_kind: ClassVar[EntryKind] = EntryKind.OBJECTION

    kind: Literal["objection"] = "objection"
    audit_ref: EntryRef | None = Field(default=None, description="the audit entry that raised it, if an audit did")
    check: CitationCheck | None = Field(default=None, description="the supervisor's citation check that raised it")
    sentence_index: SentenceIndex
    finding_refs: tuple[EntryRef, ...] = Field(default=(), max_length=_MAX_REFS)
    reason: Text

    @model_validator(mode="after")
    def _raised_by_one(self) -> Objection:
        if (self.audit_ref is None) == (self.check is None):
            raise ValueError("an objection is raised by an audit (audit_ref) or by a citation check (check), not both")
        if self.audit_ref is not None and not self.finding_refs:
            raise ValueError("an audit's objection names the findings the sentence cites (finding_refs)")
        return self

    def referenced_kinds(self) -> dict[int, EntryKind]:
        audit = {self.audit_ref: EntryKind.AUDIT} if self.audit_ref is not None else {}
        return {**_findings(self.finding_refs), **audit}

    def headline(self) -> str:
        return f"sentence {self.sentence_index}: {_short(self.reason)}"


class CitationAudit(ResearchRecord):
    """A citation auditor's judgement of the sentences it was given, recorded as ENTRY_KIND_AUDIT."""

    entry_kind: ClassVar[EntryKind] = EntryKind.AUDIT

    kind: Literal["citation_audit"] = "citation_audit"
    sentences: tuple[SentenceAudit, ...] = Field(min_length=1, max_length=_MAX_SENTENCES)

    @model_validator(mode="after")
    def _each_sentence_once(self) -> CitationAudit:
        indexes = [sentence.sentence_index for sentence in self.sentences]
        if len(indexes) != len(set(indexes)):
            raise ValueError("each sentence_index is audited once")
        return self

    def referenced_kinds(self) -> dict[int, EntryKind]:
        return _findings(ref for sentence in self.sentences for ref in sentence.finding_refs)

    def judged_sentences(self) -> frozenset[int]:
        return frozenset(sentence.sentence_index for sentence in self.sentences)

    def objections(self, audit_ref: int) -> tuple[Objection, ...]:
        """The objections this audit raises once recorded as entry `audit_ref`: one per sentence not sound."""
        return tuple(
            Objection(
                audit_ref=audit_ref,
                sentence_index=sentence.sentence_index,
                finding_refs=sentence.finding_refs,
                reason=sentence.objection,
            )
            for sentence in self.sentences
            if sentence.judgement is not CitationJudgement.SOUND
        )

    def headline(self) -> str:
        raised = sum(sentence.judgement is not CitationJudgement.SOUND for sentence in self.sentences)
        return f"{len(self.sentences)} sentence(s) audited, {raised} objection(s) raised"


class AdjudicationDecision(enum.StrEnum):
    # The objection is dismissed: the sentence stands.
    APPROVE = "approve"
    # Back to revision.
    REVISE = "revise"
    # The sentence is removed.
    REJECT = "reject"


class Adjudication(ResearchRecord):
    """An adjudicator's decision on one objection, recorded as ENTRY_KIND_ADJUDICATION."""

    entry_kind: ClassVar[EntryKind] = EntryKind.ADJUDICATION

    kind: Literal["adjudication"] = "adjudication"
    objection_ref: EntryRef = Field(description="the sequence number of the objection decided")
    decision: AdjudicationDecision
    rationale: Text

    def referenced_kinds(self) -> dict[int, EntryKind]:
        return {self.objection_ref: EntryKind.OBJECTION}

    def headline(self) -> str:
        return f"objection {self.objection_ref}: {self.decision.value}"


# -- what the supervisor logs ----------------------------------------------------------------------------


class Assignment(ResearchRecord):
    """The supervisor gave a role a contract: written before the delegation starts."""

    entry_kind: ClassVar[EntryKind] = EntryKind.ASSIGNMENT

    kind: Literal["assignment"] = "assignment"
    delegation_id: Identifier
    role: Role
    # What the delegation is for, as the role's task kind (TASK_KINDS); unset in assignments written before.
    task_kind: TaskKind | None = None
    objective: Annotated[str, StringConstraints(min_length=1, max_length=16_000), AfterValidator(_text)]
    criteria: tuple[Text, ...] = Field(default=(), max_length=10)
    input_refs: tuple[Annotated[str, StringConstraints(min_length=1, max_length=_MAX_URL)], ...] = Field(
        default=(), max_length=_MAX_REFS
    )

    def headline(self) -> str:
        return f"{self.role.value} {_delegation(self.delegation_id)}: {_short(self.objective)}"


class RouteDecision(ResearchRecord):
    """Where a delegation runs: the worker that took it, the tier and the model that tier asks for."""

    entry_kind: ClassVar[EntryKind] = EntryKind.ROUTE

    kind: Literal["route_decision"] = "route_decision"
    delegation_id: Identifier
    worker_id: Identifier
    tier: Tier
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]

    def headline(self) -> str:
        return f"{_delegation(self.delegation_id)} on {self.worker_id}, {self.tier.value} tier ({self.model})"


class UsageObserved(ResearchRecord):
    """What a delegation cost, as the model endpoint reported it (never an estimate)."""

    entry_kind: ClassVar[EntryKind] = EntryKind.USAGE

    kind: Literal["usage_observed"] = "usage_observed"
    delegation_id: Identifier
    input_tokens: Count
    output_tokens: Count
    model_calls: Count

    def headline(self) -> str:
        tokens = self.input_tokens + self.output_tokens
        return f"{_delegation(self.delegation_id)}: {tokens:,} tokens in {self.model_calls} model call(s)"


class Resolution(enum.StrEnum):
    # The sentence was rewritten and its revision audited sound.
    REVISED = "revised"
    # An adjudicator approved the sentence as written.
    DISMISSED = "dismissed"
    # The sentence is out of the report: rejected by an adjudicator, or no round left to settle it.
    SENTENCE_REMOVED = "sentence_removed"
    # Left open by the review, then approved as written by the person who approved the run.
    APPROVED_BY_PERSON = "approved_by_person"


class ObjectionResolution(ResearchRecord):
    """How the supervisor settled one objection, recorded as ENTRY_KIND_RESOLUTION: closes it for good."""

    entry_kind: ClassVar[EntryKind] = EntryKind.RESOLUTION

    kind: Literal["objection_resolution"] = "objection_resolution"
    objection_ref: EntryRef = Field(description="the sequence number of the objection settled")
    resolution: Resolution
    sentence_index: SentenceIndex
    # The sentence as the report now has it (revised), or as it was when removed, upheld or approved.
    sentence: Text
    adjudication_ref: EntryRef | None = Field(default=None, description="the adjudication that decided it, if any")
    audit_ref: EntryRef | None = Field(default=None, description="the audit that found a revision sound")
    reason: str = Field(
        default="", max_length=_MAX_TEXT, description="why, when no entry above says it (a person's approval: theirs)"
    )

    @model_validator(mode="after")
    def _backed_by_its_entry(self) -> ObjectionResolution:
        if self.resolution is Resolution.REVISED and self.audit_ref is None:
            raise ValueError("a revised sentence names the audit that found it sound (audit_ref)")
        if self.resolution is Resolution.DISMISSED and self.adjudication_ref is None:
            raise ValueError("a dismissed objection names the adjudication that dismissed it (adjudication_ref)")
        if self.resolution is Resolution.APPROVED_BY_PERSON:
            # A person decided, not an entry: none is named, and the reason says what they said.
            if self.adjudication_ref is not None or self.audit_ref is not None:
                raise ValueError("a person's approval names no adjudication_ref or audit_ref")
            if not self.reason.strip():
                raise ValueError("a person's approval gives its reason (the approver's comment)")
        if "\x00" in self.reason:
            raise ValueError("reason must not contain NUL characters")
        return self

    def referenced_kinds(self) -> dict[int, EntryKind]:
        refs = {
            self.objection_ref: EntryKind.OBJECTION,
            self.adjudication_ref: EntryKind.ADJUDICATION,
            self.audit_ref: EntryKind.AUDIT,
        }
        return {ref: kind for ref, kind in refs.items() if ref is not None}

    def headline(self) -> str:
        return f"objection {self.objection_ref}: {self.resolution.value.replace('_', ' ')}"


class ClaimRefusal(ResearchRecord):
    """The supervisor did not count a finding as verified, recorded as ENTRY_KIND_REFUSAL: the verdict it
    refused (support quoted from another page, support a second verifier did not share), or why no verdict
    came (the verifier failed, the budget was spent, the finding was past the bound). So the ledger says what
    the run's Verification says."""

    entry_kind: ClassVar[EntryKind] = EntryKind.REFUSAL

    kind: Literal["claim_refusal"] = "claim_refusal"
    finding_ref: EntryRef = Field(description="the finding left unverified")
    verdict_ref: EntryRef | None = Field(default=None, description="the verdict refused, if one was recorded")
    reason: Text

    def referenced_kinds(self) -> dict[int, EntryKind]:
        verdict = {self.verdict_ref: EntryKind.VERDICT} if self.verdict_ref is not None else {}
        return {self.finding_ref: EntryKind.FINDING, **verdict}

    def headline(self) -> str:
        return f"finding {self.finding_ref} not counted verified: {_short(self.reason)}"


class DraftSentence(ResearchRecord):
    """A sentence of the draft report as the review has it, recorded as ENTRY_KIND_SENTENCE: as drafted
    (revision 0), or a revision, written before its audit. An audit of the sentence judges its latest one."""

    entry_kind: ClassVar[EntryKind] = EntryKind.SENTENCE

    kind: Literal["draft_sentence"] = "draft_sentence"
    # Which draft it belongs to (a digest of the draft's text): a run taken up during its review writes its
    # report again, and only the latest draft's sentences, audits and objections count.
    draft: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{0,64}$")] = ""
    sentence_index: SentenceIndex
    revision: int = Field(default=0, ge=0, le=64, description="0: as drafted; n: the revision of round n")
    text: Text
    finding_refs: tuple[EntryRef, ...] = Field(default=(), max_length=_MAX_REFS, description="the findings it cites")

    def referenced_kinds(self) -> dict[int, EntryKind]:
        return _findings(self.finding_refs)

    def headline(self) -> str:
        return f"sentence {self.sentence_index}: {_short(self.text)}"


class BibliographicJudgement(enum.StrEnum):
    # The catalogue has the paper, and its title, authors and year are what the finding's source says.
    VERIFIED = "verified"
    # The catalogue has a paper at that place, but not the one the source says (another title, authors, year).
    MISMATCH = "mismatch"
    # No catalogue has it.
    NOT_FOUND = "not_found"


class CatalogRecord(BaseModel):
    """A paper as a literature catalogue lists it, copied from what the verifier looked up."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    url: Url = Field(description="the catalogue's page for the paper, exactly as look_up_paper listed it")
    title: Text
    authors: tuple[Annotated[str, StringConstraints(min_length=1, max_length=500)], ...] = Field(
        default=(), max_length=100
    )
    year: int | None = Field(default=None, ge=1000, le=3000)


class BibliographicVerdict(ResearchRecord):
    """A bibliographic verifier's judgement of the paper a finding cites, as ENTRY_KIND_BIBLIOGRAPHIC_VERDICT."""

    entry_kind: ClassVar[EntryKind] = EntryKind.BIBLIOGRAPHIC_VERDICT

    kind: Literal["bibliographic_verdict"] = "bibliographic_verdict"
    finding_ref: EntryRef = Field(description="the finding whose cited paper is judged")
    cited_url: Url = Field(description="the source of the finding that is judged, as the finding cites it")
    judgement: BibliographicJudgement
    record: CatalogRecord | None = Field(
        default=None, description="the catalogue's record the judgement rests on; required unless not_found"
    )
    rationale: Text

    @model_validator(mode="after")
    def _record_backs_the_judgement(self) -> BibliographicVerdict:
        if self.record is None and self.judgement is not BibliographicJudgement.NOT_FOUND:
            raise ValueError(f"a {self.judgement.value} verdict names the catalogue's record it rests on (record)")
        return self

    def referenced_kinds(self) -> dict[int, EntryKind]:
        return {self.finding_ref: EntryKind.FINDING}

    def cited_urls(self) -> frozenset[str]:
        return frozenset({self.cited_url})

    def headline(self) -> str:
        return f"finding {self.finding_ref}'s paper: {self.judgement.value}"


class Candidate(BaseModel):
    """One source a scout found, as its search or look-up listed it, and why it bears on the question."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    url: Url = Field(description="the source, exactly as a search or look-up in this task listed it")
    title: Text
    why: Text = Field(description="why it is relevant to the question")


class CandidateSources(ResearchRecord):
    """A scout's screening of the literature for a question, recorded as ENTRY_KIND_CANDIDATES: sources to read,
    never citations."""

    entry_kind: ClassVar[EntryKind] = EntryKind.CANDIDATES

    kind: Literal["candidate_sources"] = "candidate_sources"
    candidates: tuple[Candidate, ...] = Field(min_length=1, max_length=_MAX_REFS)

    def headline(self) -> str:
        return f"{len(self.candidates)} candidate source(s)"


class EvidenceKind(enum.StrEnum):
    CLAIM = "claim"
    EXPERIMENT = "experiment"
    # A paper's analysis (quarry.literature): what it sets out to solve, how, what it found, where it stops.
    PROBLEM = "problem"
    METHOD = "method"
    RESULT = "result"
    LIMITATION = "limitation"


class Extract(BaseModel):
    """One claim or experiment taken out of a source: what it says, the words it says it in, and where."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    kind: EvidenceKind
    statement: Text = Field(
        description="the claim, the experiment and its result, or (analysing a paper) its problem, method, a "
        "result with its numbers, or a limitation, in one sentence"
    )
    quote: Excerpt = Field(description="the source's words it rests on, quoted verbatim")
    location: Annotated[str, StringConstraints(min_length=1, max_length=200)] = Field(
        description="where in the source: a section, a table, a page"
    )


class ExtractedEvidence(ResearchRecord):
    """An extractor's records from one source, recorded as ENTRY_KIND_EVIDENCE."""

    entry_kind: ClassVar[EntryKind] = EntryKind.EVIDENCE

    kind: Literal["extracted_evidence"] = "extracted_evidence"
    source_url: Url = Field(description="the one source read, as the task names it")
    records: tuple[Extract, ...] = Field(min_length=1, max_length=_MAX_REFS)

    def cited_urls(self) -> frozenset[str]:
        return frozenset({self.source_url})

    def headline(self) -> str:
        return f"{len(self.records)} record(s) from {self.source_url}"


class TaskKind(enum.StrEnum):
    """What a delegation is for: each role does one kind of task (TASK_KINDS)."""

    RESEARCH = "research"
    LITERATURE_SCREENING = "literature_screening"
    EVIDENCE_EXTRACTION = "evidence_extraction"
    CLAIM_VERIFICATION = "claim_verification"
    BIBLIOGRAPHIC_VERIFICATION = "bibliographic_verification"
    CITATION_AUDIT = "citation_audit"
    ADJUDICATION = "adjudication"
    ENGINEERING = "engineering"
    REPORT_WRITING = "report_writing"


TASK_KINDS: Mapping[Role, TaskKind] = MappingProxyType(
    {
        Role.RESEARCHER: TaskKind.RESEARCH,
        Role.SCOUT: TaskKind.LITERATURE_SCREENING,
        Role.EXTRACTOR: TaskKind.EVIDENCE_EXTRACTION,
        Role.VERIFIER: TaskKind.CLAIM_VERIFICATION,
        Role.BIBLIOGRAPHIC_VERIFIER: TaskKind.BIBLIOGRAPHIC_VERIFICATION,
        Role.CITATION_AUDITOR: TaskKind.CITATION_AUDIT,
        Role.ADJUDICATOR: TaskKind.ADJUDICATION,
        Role.ENGINEER: TaskKind.ENGINEERING,
        Role.WRITER: TaskKind.REPORT_WRITING,
    }
)


def _findings(refs: Iterable[int]) -> dict[int, EntryKind]:
    return dict.fromkeys(refs, EntryKind.FINDING)


RECORD_TYPES: Mapping[EntryKind, type[ResearchRecord]] = MappingProxyType(
    {
        record.entry_kind: record
        for record in (
            ClaimVerdict,
            CitationAudit,
            Objection,
            Adjudication,
            Assignment,
            RouteDecision,
            UsageObserved,
            ObjectionResolution,
            ClaimRefusal,
            DraftSentence,
            BibliographicVerdict,
            CandidateSources,
            ExtractedEvidence,
        )
    }
)


def parse_record(kind: EntryKind, content: str | bytes) -> ResearchRecord:
    """The record an entry of `kind` holds; RecordError when the kind holds none or the content is not one."""
    record = RECORD_TYPES.get(kind)
    if record is None:
        raise RecordError([f"ENTRY_KIND_{kind.name} entries hold no research record"])
    return record.parse(content)


# How much of an entry a run's stream shows.
PREVIEW_CHARS = 500


def entry_preview(kind: EntryKind, content: str) -> str:
    """What a person following a run reads of an entry: a ledger record's headline, else its text, cut at a word
    (a replay matches an append to its recorded entry by this)."""
    text = content
    if kind in RECORD_TYPES:
        with contextlib.suppress(ValueError):  # a record this build cannot read is shown as it is
            text = parse_record(kind, content).headline()
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS].rsplit(" ", 1)[0] + "…"


@dataclass(frozen=True)
class InputRefs:
    """A contract's input refs, read: the scratchpad entries, the pages and the report sentences it names
    (anything else is ignored)."""

    entries: frozenset[int] = frozenset()
    urls: frozenset[str] = frozenset()
    # Report sentences by index ("sentence:3"): an audit under a contract naming any judges only those.
    sentences: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, refs: Iterable[str]) -> InputRefs:
        entries, urls, sentences = set(), set(), set()
        for ref in (ref.strip() for ref in refs):
            index = ref.removeprefix(SENTENCE_REF)
            if ref.isascii() and ref.isdecimal() and int(ref) > 0:
                entries.add(int(ref))
            elif ref.startswith(_URL_SCHEMES):
                urls.add(ref)
            elif index != ref and index.isascii() and index.isdecimal():
                sentences.add(int(index))
        return cls(frozenset(entries), frozenset(urls), frozenset(sentences))

    def outside(self, record: ResearchRecord) -> list[str]:
        """What `record` cites that is not among these refs, one line each (empty: all inside)."""
        entries = sorted(record.cited_entries() - self.entries)
        urls = sorted(record.cited_urls() - self.urls)
        sentences = sorted(record.judged_sentences() - self.sentences) if self.sentences else []
        return (
            [f"scratchpad entry {n} is not among your inputs" for n in entries]
            + [f"{url} is not among your inputs" for url in urls]
            + [f"sentence {n} is not among your inputs: judge only the sentence your task gives" for n in sentences]
        )

    def as_refs(self) -> tuple[str, ...]:
        """The refs written as a contract carries them: entries in decimal, in order, then the URLs, then the
        sentences."""
        sentences = (f"{SENTENCE_REF}{n}" for n in sorted(self.sentences))
        return (*map(str, sorted(self.entries)), *sorted(self.urls), *sentences)
