"""The ledger's records: exact JSON round trips, strictness, the rules each enforces, and contract refs."""

from __future__ import annotations

import json

import pytest

from quarry.identity import Role
from quarry.records.base import RecordError
from quarry.records.research import (
    RECORD_TYPES,
    Adjudication,
    AdjudicationDecision,
    Assignment,
    BibliographicJudgement,
    BibliographicVerdict,
    Candidate,
    CandidateSources,
    CatalogRecord,
    CitationAudit,
    CitationJudgement,
    ClaimJudgement,
    ClaimRefusal,
    ClaimVerdict,
    DraftSentence,
    EvidenceKind,
    Extract,
    ExtractedEvidence,
    InputRefs,
    Objection,
    ObjectionResolution,
    ResearchRecord,
    Resolution,
    RouteDecision,
    SentenceAudit,
    UsageObserved,
    VerifiedQuote,
    parse_record,
)
from quarry.vocabulary import EntryKind, Tier

QUOTE = VerifiedQuote(url="https://example.org/eiffel", excerpt="The tower is 330 metres tall")
AUDIT = CitationAudit(
    sentences=(
        SentenceAudit(sentence_index=0, finding_refs=(2,), judgement=CitationJudgement.SOUND),
        SentenceAudit(
            sentence_index=3, finding_refs=(2, 5), judgement=CitationJudgement.NEEDS_REVISION, objection="too strong"
        ),
    )
)
EXAMPLES: list[ResearchRecord] = [
    ClaimVerdict(finding_ref=2, judgement=ClaimJudgement.PARTIALLY_SUPPORTED, quote=QUOTE, rationale="less precise"),
    AUDIT,
    AUDIT.objections(7)[0],
    Adjudication(objection_ref=8, decision=AdjudicationDecision.REVISE, rationale="say 'about 330 m'"),
    Assignment(
        delegation_id="run-1:call-1",
        role=Role.CITATION_AUDITOR,
        objective="Audit sentence 3.",
        criteria=("cite only findings",),
        input_refs=("2", "5"),
    ),
    RouteDecision(delegation_id="run-1:call-1", worker_id="worker-2", tier=Tier.SUPERVISOR, model="big"),
    UsageObserved(delegation_id="run-1:call-1", input_tokens=1200, output_tokens=80, model_calls=3),
    ObjectionResolution(
        objection_ref=8, resolution=Resolution.REVISED, sentence_index=3, sentence="About 330 m [2].", audit_ref=11
    ),
    ObjectionResolution(
        objection_ref=9,
        resolution=Resolution.APPROVED_BY_PERSON,
        sentence_index=4,
        sentence="It is the tallest [2].",
        reason="Checked the source myself.",
    ),
    ClaimRefusal(finding_ref=2, verdict_ref=6, reason="not verified: the quote is from another page"),
    DraftSentence(sentence_index=3, revision=1, text="About 330 m [2].", finding_refs=(2,)),
    BibliographicVerdict(
        finding_ref=2,
        cited_url="https://arxiv.org/abs/1901.00001",
        judgement=BibliographicJudgement.VERIFIED,
        record=CatalogRecord(url="http://arxiv.org/abs/1901.00001v2", title="Wind Load", authors=("A. G.",), year=2019),
        rationale="arXiv lists it",
    ),
    CandidateSources(candidates=(Candidate(url="https://a.example/", title="A", why="it measures the tower"),)),
    ExtractedEvidence(
        source_url="https://a.example/",
        records=(Extract(kind=EvidenceKind.EXPERIMENT, statement="Wind tests.", quote="we tested", location="§2"),),
    ),
]


def test_every_record_round_trips_its_json_exactly_under_its_entry_kind() -> None:
    assert {type(record) for record in EXAMPLES} == set(RECORD_TYPES.values())
    for record in EXAMPLES:
        text = record.model_dump_json()
        data = json.loads(text)
        assert (data["kind"], data["schema_version"]) == (record.record_kind(), 1)
        parsed = parse_record(record.entry_kind, text)
        assert parsed == record and parsed.model_dump_json() == text
        assert RECORD_TYPES[record.entry_kind] is type(record)


def test_records_are_strict_and_closed() -> None:
    text = EXAMPLES[0].model_dump_json()
    for bad in [
        text.replace('"finding_ref":2', '"finding_ref":"2"'),  # no coercion from strings
        text.replace('"finding_ref":2', '"finding_ref":2.0'),
        text.replace('"judgement":"partially_supported"', '"judgement":"mostly"'),
        text.replace('"schema_version":1', '"schema_version":2'),
        text.replace("}", ',"extra":1}', 1),
        text.replace('"claim_verdict"', '"citation_audit"'),
        "not json",
    ]:
        with pytest.raises(RecordError):
            parse_record(EntryKind.VERDICT, bad)
    with pytest.raises(RecordError, match="hold no research record"):
        parse_record(EntryKind.FINDING, text)
    with pytest.raises(ValueError):  # frozen
        EXAMPLES[0].finding_ref = 3  # type: ignore[misc]


def test_each_record_enforces_its_rules() -> None:
    problems = {
        "a supported verdict without its quote": '{"finding_ref":2,"judgement":"supported","rationale":"r"}',
        "a blank rationale": '{"finding_ref":2,"judgement":"unsupported","rationale":"  "}',
        "a quote from a file": '{"finding_ref":2,"judgement":"unsupported","rationale":"r",'
        '"quote":{"url":"file:///etc/passwd","excerpt":"x"}}',
        "a finding ref of 0": '{"finding_ref":0,"judgement":"unsupported","rationale":"r"}',
    }
    for text in problems.values():
        with pytest.raises(RecordError):
            ClaimVerdict.parse(text)
    unsupported = ClaimVerdict.parse('{"finding_ref":2,"judgement":"unsupported","rationale":"not on the page"}')
    assert isinstance(unsupported, ClaimVerdict) and unsupported.quote is None
    sentence = '{{"sentence_index":{0},"finding_refs":[2],"judgement":"{1}","objection":"{2}"}}'
    for sentences in [
        [sentence.format(0, "unsound", "")],  # not sound, and no objection
        [sentence.format(0, "sound", "but why")],  # sound, with an objection
        [sentence.format(0, "sound", ""), sentence.format(0, "sound", "")],  # a sentence twice
        [],
    ]:
        with pytest.raises(RecordError):
            CitationAudit.parse('{"sentences":[' + ",".join(sentences) + "]}")


def test_a_resolution_names_what_settled_it() -> None:
    resolution = '{{"objection_ref":8,"resolution":"{0}","sentence_index":3,"sentence":"About 330 m [2]."{1}}}'
    for text in [
        resolution.format("revised", ""),  # no audit found the revision sound
        resolution.format("dismissed", ',"reason":"fine"'),  # no adjudication dismissed it
        resolution.format("approved_by_person", ""),  # a person's approval without their reason
        resolution.format("approved_by_person", ',"reason":"  "'),
        resolution.format("approved_by_person", ',"reason":"ok","adjudication_ref":9'),  # a person, not an entry
        resolution.format("approved_by_person", ',"reason":"ok","audit_ref":9'),
    ]:
        with pytest.raises(RecordError):
            ObjectionResolution.parse(text)
    approved = ObjectionResolution.parse(resolution.format("approved_by_person", ',"reason":"ok"'))
    assert isinstance(approved, ObjectionResolution) and approved.cited_entries() == {8}


def test_an_audit_raises_one_objection_per_sentence_not_sound() -> None:
    assert AUDIT.objections(7) == (Objection(audit_ref=7, sentence_index=3, finding_refs=(2, 5), reason="too strong"),)
    assert AUDIT.cited_entries() == {2, 5}
    assert AUDIT.objections(7)[0].cited_entries() == {7, 2, 5}


def test_input_refs_read_entries_and_urls_and_name_what_a_record_cites_outside_them() -> None:
    refs = InputRefs.parse([" 2", "https://example.org/eiffel", "0", "the seed", "12", "corpus://notes/a.md"])
    assert refs.entries == {2, 12} and refs.urls == {"https://example.org/eiffel", "corpus://notes/a.md"}
    assert refs.as_refs() == ("2", "12", "corpus://notes/a.md", "https://example.org/eiffel")
    assert refs.outside(EXAMPLES[0]) == []
    elsewhere = ClaimVerdict(
        finding_ref=3,
        judgement=ClaimJudgement.CONTRADICTED,
        quote=VerifiedQuote(url="https://other.example", excerpt="324 m"),
        rationale="r",
    )
    assert refs.outside(elsewhere) == [
        "scratchpad entry 3 is not among your inputs",
        "https://other.example is not among your inputs",
    ]
