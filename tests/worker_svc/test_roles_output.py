"""The evidence roles over real gRPC with the scripted model: blind contracts, fixed authority, checked outputs.

A claim-verifier, citation auditor and adjudicator each end by submitting their record; the worker checks
its kind, shape and references before it records anything, allows one repair turn, and otherwise fails
the delegation as OUTPUT_REFUSED or OUTPUT_INVALID with nothing written.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.records.research import (
    Adjudication,
    AdjudicationDecision,
    BibliographicJudgement,
    BibliographicVerdict,
    CandidateSources,
    CatalogRecord,
    CitationAudit,
    ClaimJudgement,
    ClaimVerdict,
    EvidenceKind,
    ExtractedEvidence,
    Objection,
    VerifiedQuote,
)
from quarry.v1 import common_pb2, scratchpad_pb2, worker_pb2, worker_pb2_grpc
from tests.fakes.literature_server import Literature
from tests.fakes.openai_server import Call, Reply, ScriptedModel
from tests.fakes.web_server import FixtureWeb
from tests.rpc import violations
from tests.worker_svc.test_delegate import in_process

STRONG = "scripted-strong"  # the supervisor tier's model; the worker's is "scripted"
QUESTION = "How tall is the Eiffel Tower?"
SEED = "Supervisor plan: I already believe the answer is 330 m, so check it quickly."
CLAIM = "The Eiffel Tower is 330 m tall."
OTHER_FINDING = "The tower was finished in 1889 by Eiffel's company."
OTHER_VERDICT = "Another verifier found the completion date supported."
QUOTE = "The tower is 330 metres tall"
# The thread as a supervisor would have built it: 1 seed, 2 and 3 findings, 4 a verdict on 3.
LAST = 4


@dataclass
class Ledger:
    model: ScriptedModel
    worker: worker_pb2_grpc.WorkerServiceStub
    scratchpad: ScratchpadClient
    thread_id: str
    article: str
    elsewhere: str

    async def delegate(
        self,
        role: common_pb2.Role.ValueType,
        input_refs: list[str],
        objective: str,
        delegation_id: str = "run-1:call-1",
        tier: common_pb2.ModelTier.ValueType = common_pb2.MODEL_TIER_UNSPECIFIED,
    ) -> tuple[worker_pb2.DelegationStarted, worker_pb2.DelegationResult, list[dict[str, Any]]]:
        """Run one delegation; its started event, its result, and the model requests it made."""
        first = len(self.model.requests)
        request = worker_pb2.DelegateRequest(
            delegation_id=delegation_id,
            run_id="run-1",
            tool_call_id=delegation_id.split(":")[-1],
            scratchpad_thread_id=self.thread_id,
            task=worker_pb2.ResearchTask(
                objective=objective, criteria=["judge only from your inputs"], input_refs=input_refs, question=QUESTION
            ),
            role=role,
            tier=tier,
        )
        events = [event async for event in self.worker.Delegate(request, timeout=60)]
        assert events[0].WhichOneof("event") == "started" and events[-1].WhichOneof("event") == "result"
        return events[0].started, events[-1].result, self.model.requests[first:]

    async def entries(self) -> list[scratchpad_pb2.Entry]:
        return list(await self.scratchpad.read_all(self.thread_id))


def principal(role: common_pb2.Role.ValueType, name: str) -> common_pb2.Principal:
    return common_pb2.Principal(principal_id=name, role=role)


@pytest.fixture
async def literature() -> AsyncIterator[Literature]:
    async with Literature() as served:
        yield served


@pytest.fixture
async def ledger(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, literature: Literature, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Ledger]:
    # The supervisor tier as a deployment names it; the worker reads it from the supervisor's settings.
    monkeypatch.setenv("QUARRY_SUPERVISOR_MODEL_NAME", STRONG)
    # A bibliographic verifier's catalogue: arXiv's API, answered by the literature fake.
    monkeypatch.setenv("QUARRY_WORKER_ARXIV_URL", literature.base_url)
    monkeypatch.setenv("QUARRY_WORKER_LITERATURE_CATALOGUES", "arxiv")
    article = f"{site.base_url}/article.html"
    elsewhere = site.add("/elsewhere.html", "<html><body><p>Nothing about towers.</p></body></html>")
    async with (
        in_process(tmp_path, model, site, True) as (scratchpad_address, worker_address, _),
        insecure_channel(worker_address) as worker_channel,
        insecure_channel(scratchpad_address) as scratchpad_channel,
    ):
        scratchpad = ScratchpadClient(scratchpad_channel)
        thread_id = (await scratchpad.create_thread(title="eiffel")).thread_id
        source = common_pb2.Source(url=article, title="The Eiffel Tower", excerpt=QUOTE)
        other = ClaimVerdict(
            finding_ref=3,
            judgement=ClaimJudgement.SUPPORTED,
            quote=VerifiedQuote(url=article, excerpt="from 1887 to 1889"),
            rationale=OTHER_VERDICT,
        )
        for kind, author, content, sources in [
            (scratchpad_pb2.ENTRY_KIND_SEED, principal(common_pb2.ROLE_SUPERVISOR, "run-1"), SEED, []),
            (scratchpad_pb2.ENTRY_KIND_FINDING, principal(common_pb2.ROLE_RESEARCHER, "r-1"), CLAIM, [source]),
            (scratchpad_pb2.ENTRY_KIND_FINDING, principal(common_pb2.ROLE_RESEARCHER, "r-2"), OTHER_FINDING, [source]),
            (
                scratchpad_pb2.ENTRY_KIND_VERDICT,
                principal(common_pb2.ROLE_VERIFIER, "v-0"),
                other.model_dump_json(),
                [],
            ),
        ]:
            await scratchpad.append(thread_id, kind=kind, author=author, content=content, sources=sources)
        yield Ledger(
            model, worker_pb2_grpc.WorkerServiceStub(worker_channel), scratchpad, thread_id, article, elsewhere
        )


def offered(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools", [])]


def tool_results(request: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in request["messages"] if m["role"] == "tool"}


def verdict_arguments(article: str, **changes: object) -> dict[str, object]:
    return {
        "finding_ref": 2,
        "judgement": "supported",
        "quote": {"url": article, "excerpt": QUOTE},
        "rationale": "The page gives the height as 330 metres.",
        **changes,
    }


async def test_a_claim_verifier_sees_only_its_contract_and_records_its_verdict(ledger: Ledger) -> None:
    ledger.model.script(
        Reply(
            calls=(
                Call("read_scratchpad", {}, "inputs"),
                Call("read_web_page", {"url": ledger.article}, "page"),
                Call("read_web_page", {"url": ledger.elsewhere}, "elsewhere"),
            )
        ),
        Reply(calls=(Call("submit_claim_verdict", verdict_arguments(ledger.article), "submit"),)),
    )
    started, result, requests = await ledger.delegate(
        common_pb2.ROLE_VERIFIER, ["2", ledger.article], "Verify finding 2 against the page it cites."
    )

    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result.error
    expected = ClaimVerdict(
        finding_ref=2,
        judgement=ClaimJudgement.SUPPORTED,
        quote=VerifiedQuote(url=ledger.article, excerpt=QUOTE),
        rationale="The page gives the height as 330 metres.",
    )
    assert result.output_kind == "claim_verdict" and ClaimVerdict.parse(result.output_json) == expected
    assert result.output_sequence_no == LAST + 1 and list(result.promoted_sequence_nos) == [LAST + 1]
    assert result.summary == "finding 2: supported" and result.turns_used == 2
    entry = (await ledger.entries())[-1]
    assert (entry.sequence_no, entry.kind, entry.author.role) == (
        LAST + 1,
        scratchpad_pb2.ENTRY_KIND_VERDICT,
        common_pb2.ROLE_VERIFIER,
    )
    assert entry.content == result.output_json and [(s.url, s.excerpt) for s in entry.sources] == [
        (ledger.article, QUOTE)
    ]
    # The worker tier by default, said on the started event and the result.
    assert (started.tier, started.model) == (common_pb2.MODEL_TIER_WORKER, "scripted")
    assert (result.tier, result.model) == (common_pb2.MODEL_TIER_WORKER, "scripted")
    assert {request["model"] for request in requests} == {"scripted"}

    # Its tools: the cited page and its inputs, no search, no append; it ends by submitting.
    assert offered(requests[0]) == [
        "read_web_page",
        "search_web_page",
        "scroll_web_page",
        "read_scratchpad",
        "submit_claim_verdict",
    ]
    results = tool_results(requests[1])
    assert CLAIM in results["inputs"] and "[2]" in results["inputs"]
    assert "only the pages its inputs name" in results["elsewhere"]
    # Blind: no request carries another finding, the supervisor's text or another verdict.
    for request in requests:
        seen = json.dumps(request["messages"])
        assert QUESTION in seen and "Verify finding 2" in seen
        for hidden in (SEED, OTHER_FINDING, OTHER_VERDICT, "[3]", "[4]"):
            assert hidden not in seen, hidden

    record = await ledger.worker.GetDelegation(worker_pb2.GetDelegationRequest(delegation_id="run-1:call-1"))
    assert record.delegation.task.question == QUESTION and record.delegation.tier == common_pb2.MODEL_TIER_WORKER
    assert record.delegation.result.output_json == result.output_json
    assert record.delegation.result.output_sequence_no == LAST + 1


async def test_an_audit_raises_objections_and_an_adjudicator_decides_one_each_on_its_tier(ledger: Ledger) -> None:
    reason = "Finding 3 says 1889, not 1900."
    ledger.model.script(
        Reply(calls=(Call("read_scratchpad", {}, "inputs"),)),
        Reply(
            calls=(
                Call(
                    "submit_citation_audit",
                    {
                        "sentences": [
                            {"sentence_index": 0, "finding_refs": [2], "judgement": "sound"},
                            {"sentence_index": 1, "finding_refs": [3], "judgement": "unsound", "objection": reason},
                        ]
                    },
                    "audit",
                ),
            )
        ),
    )
    started, audited, requests = await ledger.delegate(
        common_pb2.ROLE_CITATION_AUDITOR,
        ["2", "3"],
        'Audit sentence 0, "The tower is 330 m tall [2].", and sentence 1, "It was finished in 1900 [3]."',
    )
    assert audited.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, audited.error
    audit = CitationAudit.parse(audited.output_json)
    assert isinstance(audit, CitationAudit) and audited.output_kind == "citation_audit"
    objection = Objection(audit_ref=LAST + 1, sentence_index=1, finding_refs=(3,), reason=reason)
    assert list(audited.promoted_sequence_nos) == [LAST + 1, LAST + 2]
    entries = await ledger.entries()
    assert [(e.kind, e.author.role) for e in entries[LAST:]] == [
        (scratchpad_pb2.ENTRY_KIND_AUDIT, common_pb2.ROLE_CITATION_AUDITOR),
        (scratchpad_pb2.ENTRY_KIND_OBJECTION, common_pb2.ROLE_CITATION_AUDITOR),
    ]
    assert entries[LAST].content == audited.output_json and entries[LAST + 1].content == objection.model_dump_json()
    # The auditor runs on the supervisor tier by default, with its inputs only and no web.
    assert (started.tier, started.model, audited.model) == (common_pb2.MODEL_TIER_SUPERVISOR, STRONG, STRONG)
    assert {request["model"] for request in requests} == {STRONG}
    assert offered(requests[0]) == ["read_scratchpad", "submit_citation_audit"]

    ledger.model.script(
        Reply(calls=(Call("read_scratchpad", {}, "inputs"),)),
        Reply(
            calls=(
                Call(
                    "submit_adjudication",
                    {"objection_ref": LAST + 2, "decision": "reject", "rationale": "The cited finding says 1889."},
                    "decide",
                ),
            )
        ),
    )
    started, decided, requests = await ledger.delegate(
        common_pb2.ROLE_ADJUDICATOR,
        [str(LAST + 2)],
        f"Decide objection {LAST + 2}.",
        delegation_id="run-1:call-2",
        tier=common_pb2.MODEL_TIER_WORKER,  # a request may name the tier
    )
    assert decided.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, decided.error
    assert Adjudication.parse(decided.output_json) == Adjudication(
        objection_ref=LAST + 2, decision=AdjudicationDecision.REJECT, rationale="The cited finding says 1889."
    )
    assert decided.summary == f"objection {LAST + 2}: reject" and decided.output_sequence_no == LAST + 3
    entry = (await ledger.entries())[-1]
    assert (entry.kind, entry.author.role) == (scratchpad_pb2.ENTRY_KIND_ADJUDICATION, common_pb2.ROLE_ADJUDICATOR)
    assert (started.tier, decided.model) == (common_pb2.MODEL_TIER_WORKER, "scripted")
    assert {request["model"] for request in requests} == {"scripted"}
    assert offered(requests[0]) == ["read_scratchpad", "submit_adjudication"]
    inputs = tool_results(requests[1])["inputs"]
    assert f"[{LAST + 2}]" in inputs and f"[{LAST + 1}]" not in inputs and CLAIM not in inputs


FINDING = {"kind": "finding", "content": CLAIM, "sources": [{"url": "https://x.example", "excerpt": "x"}]}
OUTSIDE = {"sentences": [{"sentence_index": 0, "finding_refs": [3], "judgement": "sound"}]}
REFUSALS = {
    # (role, input refs, the tool it calls twice, its arguments, what the refusal says)
    "a verifier emitting a finding": (
        common_pb2.ROLE_VERIFIER,
        ["2", "{article}"],
        "submit_finding",
        FINDING,
        "ROLE_VERIFIER may not emit 'finding'",
    ),
    "a finding passed off as a verdict": (
        common_pb2.ROLE_VERIFIER,
        ["2", "{article}"],
        "submit_claim_verdict",
        FINDING,
        "ROLE_VERIFIER may not emit 'finding'",
    ),
    "an audit citing an entry outside its contract": (
        common_pb2.ROLE_CITATION_AUDITOR,
        ["2"],
        "submit_citation_audit",
        OUTSIDE,
        "scratchpad entry 3 is not among your inputs",
    ),
    "a quote from a page it never read": (
        common_pb2.ROLE_VERIFIER,
        ["2", "{article}"],
        "submit_claim_verdict",
        "verdict",
        "was not read in this task",
    ),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
async def test_a_refused_output_gets_one_repair_turn_then_fails_recording_nothing(ledger: Ledger, case: str) -> None:
    role, refs, tool, arguments, problem = REFUSALS[case]
    input_refs = [ref.format(article=ledger.article) for ref in refs]
    submitted = verdict_arguments(ledger.article) if arguments == "verdict" else arguments
    ledger.model.script(
        Reply(calls=(Call(tool, submitted, "first"),)),
        Reply(calls=(Call(tool, submitted, "second"),)),
        Reply(content="never asked for"),
    )
    _, result, requests = await ledger.delegate(role, input_refs, "Judge your inputs.")

    assert result.outcome == common_pb2.DELEGATION_OUTCOME_FAILED
    assert result.error.code == common_pb2.DELEGATION_ERROR_CODE_OUTPUT_REFUSED, result.error
    assert problem in result.error.message
    assert len(requests) == 2, "one repair turn, no more"
    repair = tool_results(requests[1])["first"]
    assert problem in repair and "one more turn" in repair
    assert "submit_finding" not in offered(requests[0])
    assert (result.output_kind, result.output_json, list(result.promoted_sequence_nos)) == ("", "", [])
    assert len(await ledger.entries()) == LAST, "nothing was recorded"


async def test_a_malformed_output_is_repaired_once(ledger: Ledger) -> None:
    ledger.model.script(
        Reply(calls=(Call("read_web_page", {"url": ledger.article}, "page"),)),
        Reply(
            calls=(
                Call(
                    "submit_claim_verdict", verdict_arguments(ledger.article, finding_ref="2", judgement="true"), "bad"
                ),
            )
        ),
        Reply(calls=(Call("submit_claim_verdict", verdict_arguments(ledger.article), "good"),)),
    )
    _, result, requests = await ledger.delegate(common_pb2.ROLE_VERIFIER, ["2", ledger.article], "Verify finding 2.")

    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result.error
    repair = tool_results(requests[2])["bad"]
    assert "finding_ref" in repair and "judgement" in repair and "one more turn" in repair
    assert result.turns_used == 3 and result.output_sequence_no == LAST + 1
    assert [e.kind for e in (await ledger.entries())[LAST:]] == [scratchpad_pb2.ENTRY_KIND_VERDICT]


async def test_a_prose_answer_is_told_to_submit_once(ledger: Ledger) -> None:
    ledger.model.script(
        Reply(content="The finding is supported by the page."),
        Reply(
            calls=(
                Call(
                    "submit_claim_verdict",
                    {"finding_ref": 2, "judgement": "unsupported", "rationale": "I could not check it."},
                    "submit",
                ),
            )
        ),
    )
    _, result, requests = await ledger.delegate(common_pb2.ROLE_VERIFIER, ["2", ledger.article], "Verify finding 2.")

    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result.error
    prompt = requests[1]["messages"][-1]
    assert prompt["role"] == "user" and "submit_claim_verdict" in prompt["content"]
    assert result.summary == "finding 2: unsupported"


STILL_MALFORMED = {
    "arguments that are no JSON, then a bad shape": (
        Reply(calls=(Call("submit_adjudication", '{"objection_ref": 3,', "first"),)),
        Reply(calls=(Call("submit_adjudication", {"objection_ref": 3, "decision": "maybe"}, "second"),)),
        "decision",
    ),
    "prose twice": (
        Reply(content="I approve."),
        Reply(content="I approve, really."),
        "no adjudication was submitted",
    ),
    "a repair turn that submits nothing": (
        Reply(calls=(Call("submit_adjudication", {"decision": "approve"}, "first"),)),
        Reply(calls=(Call("read_scratchpad", {}, "reading"),)),
        "the repair turn did not submit a corrected adjudication",
    ),
}


@pytest.mark.parametrize("case", STILL_MALFORMED, ids=list(STILL_MALFORMED))
async def test_an_output_still_malformed_after_its_repair_fails_invalid_recording_nothing(
    ledger: Ledger, case: str
) -> None:
    first, second, problem = STILL_MALFORMED[case]
    ledger.model.script(first, second, Reply(content="never asked for"))
    _, result, requests = await ledger.delegate(common_pb2.ROLE_ADJUDICATOR, ["3"], "Decide objection 3.")

    assert result.error.code == common_pb2.DELEGATION_ERROR_CODE_OUTPUT_INVALID, result.error
    assert problem in result.error.message
    assert len(requests) == 2 and result.summary == "" and result.output_json == ""
    assert len(await ledger.entries()) == LAST, "nothing was recorded"


PAPER = "http://arxiv.org/abs/1901.00001v2"
WIND = CatalogRecord(
    url=PAPER,
    title="Wind Load on Wrought-Iron Lattice Towers",
    authors=("Ada Girder", "Ben Rivet", "Cleo Truss", "Dan Strut", "Eve Gusset", "Finn Purlin", "Gail Spandrel"),
    year=2019,
)


def bibliographic_arguments(article: str, record: CatalogRecord | None, judgement: str = "verified") -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "finding_ref": 2,
        "cited_url": article,
        "judgement": judgement,
        "rationale": "the catalogue lists it as the source names it",
    }
    if record is not None:
        arguments["record"] = record.model_dump(mode="json")
    return arguments


async def test_a_bibliographic_verifier_looks_the_paper_up_and_copies_the_catalogues_record(ledger: Ledger) -> None:
    ledger.model.script(
        Reply(calls=(Call("read_scratchpad", {}, "inputs"), Call("look_up_paper", {"query": "wind load"}, "look"))),
        Reply(calls=(Call("submit_bibliographic_verdict", bibliographic_arguments(ledger.article, WIND), "submit"),)),
    )
    _, result, requests = await ledger.delegate(
        common_pb2.ROLE_BIBLIOGRAPHIC_VERIFIER, ["2", ledger.article], "Verify the paper finding 2 cites."
    )

    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result.error
    recorded = BibliographicVerdict.parse(result.output_json)
    assert isinstance(recorded, BibliographicVerdict)
    assert (recorded.judgement, recorded.record) == (BibliographicJudgement.VERIFIED, WIND)
    assert result.summary == "finding 2's paper: verified"
    entry = (await ledger.entries())[-1]
    assert (entry.kind, entry.author.role) == (
        scratchpad_pb2.ENTRY_KIND_BIBLIOGRAPHIC_VERDICT,
        common_pb2.ROLE_BIBLIOGRAPHIC_VERIFIER,
    )
    # Its tools: the catalogues and its inputs; no web, no search of the open web, no append.
    assert offered(requests[0]) == ["look_up_paper", "read_scratchpad", "submit_bibliographic_verdict"]
    listed = tool_results(requests[1])["look"]
    assert "Wind Load on Wrought-Iron Lattice Towers" in listed and PAPER in listed and "year: 2019" in listed


@pytest.mark.parametrize("case", ["never-looked-up", "another-title", "made-up-url"])
async def test_a_bibliographic_verdict_must_copy_a_record_its_look_ups_listed(ledger: Ledger, case: str) -> None:
    """A record it did not look up, or one it altered, is refused, repair turn included: nothing is recorded."""
    altered = {
        "never-looked-up": WIND,
        "another-title": WIND.model_copy(update={"title": "Wind Load on Lattice Towers, Revisited"}),
        "made-up-url": WIND.model_copy(update={"url": "http://arxiv.org/abs/9999.99999"}),
    }[case]
    look = () if case == "never-looked-up" else (Call("look_up_paper", {"query": "wind load"}, "look"),)
    submit = Call("submit_bibliographic_verdict", bibliographic_arguments(ledger.article, altered), "submit")
    ledger.model.script(
        Reply(calls=(Call("read_scratchpad", {}, "inputs"), *look)),
        Reply(calls=(submit,)),
        Reply(calls=(dataclasses.replace(submit, id="again"),)),
    )
    before = len(await ledger.entries())
    _, result, requests = await ledger.delegate(
        common_pb2.ROLE_BIBLIOGRAPHIC_VERIFIER, ["2", ledger.article], "Verify the paper finding 2 cites."
    )
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_FAILED
    assert result.error.code == common_pb2.DELEGATION_ERROR_CODE_OUTPUT_REFUSED
    said = tool_results(requests[2])["submit"]
    expected = {
        "never-looked-up": "was not listed by look_up_paper in this task",
        "another-title": "record.title is not the catalogue's",
        "made-up-url": "was not listed by look_up_paper in this task",
    }[case]
    assert expected in said
    assert len(await ledger.entries()) == before


async def test_an_auditor_given_one_sentence_may_judge_only_that_one(ledger: Ledger) -> None:
    """Its contract names sentence 1: an audit that also judges sentence 7 would raise an objection against a
    sentence it was never shown; it is refused, repair turn included, and nothing is recorded."""
    judged = [
        {"sentence_index": 1, "finding_refs": [3], "judgement": "sound"},
        {"sentence_index": 7, "finding_refs": [3], "judgement": "unsound", "objection": "not shown to me"},
    ]
    audit = Call("submit_citation_audit", {"sentences": judged}, "audit")
    ledger.model.script(
        Reply(calls=(Call("read_scratchpad", {}, "inputs"),)),
        Reply(calls=(audit,)),
        Reply(calls=(dataclasses.replace(audit, id="again"),)),
    )
    before = len(await ledger.entries())
    _, result, requests = await ledger.delegate(
        common_pb2.ROLE_CITATION_AUDITOR, ["3", "sentence:1"], 'Audit sentence 1, "It was finished in 1889 [3]."'
    )
    assert result.error.code == common_pb2.DELEGATION_ERROR_CODE_OUTPUT_REFUSED
    assert "sentence 7 is not among your inputs" in tool_results(requests[2])["audit"]
    assert len(await ledger.entries()) == before


async def test_a_scout_lists_only_sources_its_searches_listed(ledger: Ledger) -> None:
    """It searches the web and the catalogues and names candidates; one it made up is refused, and once it
    names only what it was listed, its screening is recorded."""
    made_up = {"url": "https://nowhere.example/tower", "title": "Towers", "why": "sounds right"}
    listed = {"url": ledger.article, "title": "article.html", "why": "gives the tower's height and builder"}
    paper = {"url": "http://arxiv.org/abs/1901.00001v2", "title": "Wind Load", "why": "on lattice towers"}
    ledger.model.script(
        Reply(
            calls=(
                Call("perform_web_search", {"query": "eiffel tower"}, "search"),
                Call("look_up_paper", {"query": "wind load"}, "look"),
            )
        ),
        Reply(calls=(Call("submit_candidate_sources", {"candidates": [listed, made_up]}, "first"),)),
        Reply(calls=(Call("submit_candidate_sources", {"candidates": [listed, paper]}, "second"),)),
    )
    _, result, requests = await ledger.delegate(
        common_pb2.ROLE_SCOUT, [], "Screen the literature on the Eiffel Tower's height."
    )
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result.error
    assert f"candidates[1].url: {made_up['url']} was not listed by a search" in tool_results(requests[2])["first"]
    screened = CandidateSources.parse(result.output_json)
    assert isinstance(screened, CandidateSources) and [c.url for c in screened.candidates] == [
        ledger.article,
        paper["url"],
    ]
    assert result.summary == "2 candidate source(s)"
    entry = (await ledger.entries())[-1]
    assert (entry.kind, entry.author.role) == (scratchpad_pb2.ENTRY_KIND_CANDIDATES, common_pb2.ROLE_SCOUT)
    # It searches, looks up and lists papers; it reads no page and appends nothing.
    assert offered(requests[0]) == [
        "perform_web_search",
        "look_up_paper",
        "read_scratchpad",
        "new_papers",
        "citation_snowball",
        "venue_papers",
        "submit_candidate_sources",
    ]


async def test_a_researcher_lists_new_papers_and_hears_which_catalogue_this_worker_lacks(ledger: Ledger) -> None:
    """The literature skills, through a real delegation: arXiv (the fake) answers; Semantic Scholar is not among
    this worker's catalogues, and the model is told so instead of the worker reaching it."""
    listing = {"categories": ["physics.class-ph"], "since": "2019-01-01", "until": "2021-12-31", "topic": "wind"}
    ledger.model.script(
        Reply(
            calls=(
                Call("new_papers", listing, "new"),
                Call("citation_snowball", {"paper": "1901.00001", "direction": "citations"}, "snowball"),
                Call("new_papers", {**listing, "categories": ["not a category"]}, "bad"),
            )
        ),
        Reply(content="Listed the new papers."),
    )
    _, result, requests = await ledger.delegate(common_pb2.ROLE_RESEARCHER, [], "What is new on towers?")

    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result.error
    assert {"new_papers", "citation_snowball", "venue_papers"} <= set(offered(requests[0]))
    results = tool_results(requests[1])
    assert results["new"].startswith("New on arXiv in physics.class-ph from 2019-01-01 to 2021-12-31, ranked")
    assert "- Wind Load on Wrought-Iron Lattice Towers" in results["new"]
    assert "full text: https://arxiv.org/html/1901.00001" in results["new"]
    assert "does not use Semantic Scholar (QUARRY_WORKER_LITERATURE_CATALOGUES)" in results["snowball"]
    assert "name arXiv categories such as cs.CL" in results["bad"]


async def test_an_extractor_quotes_the_one_source_it_read(ledger: Ledger) -> None:
    height = {
        "kind": "claim",
        "statement": "The tower is 330 m tall.",
        "quote": "The tower is 330 metres tall",
        "location": "second paragraph",
    }
    invented = {**height, "quote": "The tower is 400 metres tall"}
    ledger.model.script(
        Reply(calls=(Call("read_web_page", {"url": ledger.article}, "read"),)),
        Reply(
            calls=(
                Call(
                    "submit_extracted_evidence",
                    {"source_url": ledger.article, "records": [height, invented]},
                    "first",
                ),
            )
        ),
        Reply(
            calls=(Call("submit_extracted_evidence", {"source_url": ledger.article, "records": [height]}, "second"),)
        ),
    )
    _, result, requests = await ledger.delegate(
        common_pb2.ROLE_EXTRACTOR, [ledger.article], "Extract the tower's dimensions from the article."
    )
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result.error
    assert "records[1].quote does not occur in" in tool_results(requests[2])["first"]
    extracted = ExtractedEvidence.parse(result.output_json)
    assert isinstance(extracted, ExtractedEvidence)
    assert [(r.kind, r.quote, r.location) for r in extracted.records] == [
        (EvidenceKind.CLAIM, "The tower is 330 metres tall", "second paragraph")
    ]
    entry = (await ledger.entries())[-1]
    assert (entry.kind, entry.author.role) == (scratchpad_pb2.ENTRY_KIND_EVIDENCE, common_pb2.ROLE_EXTRACTOR)
    # Its task names the one source it reads: none, or two, is refused before anything runs.
    request = worker_pb2.DelegateRequest(
        delegation_id="run-1:call-2",
        run_id="run-1",
        tool_call_id="call-2",
        scratchpad_thread_id=ledger.thread_id,
        task=worker_pb2.ResearchTask(objective="Extract.", input_refs=[ledger.article, ledger.elsewhere]),
        role=common_pb2.ROLE_EXTRACTOR,
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        [event async for event in ledger.worker.Delegate(request, timeout=30)]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violations(refused.value)["task.input_refs"] == "a ROLE_EXTRACTOR task names the one source it reads (a URL)"
