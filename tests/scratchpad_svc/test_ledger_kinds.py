"""The research ledger's entry kinds: who may write each, and that their content is the record they name."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc

from quarry.identity import Role
from quarry.records.research import (
    Adjudication,
    AdjudicationDecision,
    Assignment,
    BibliographicJudgement,
    BibliographicVerdict,
    CitationAudit,
    CitationCheck,
    CitationJudgement,
    ClaimJudgement,
    ClaimRefusal,
    ClaimVerdict,
    DraftSentence,
    Objection,
    ObjectionResolution,
    ResearchRecord,
    Resolution,
    RouteDecision,
    SentenceAudit,
    UsageObserved,
)
from quarry.v1 import common_pb2, scratchpad_pb2, scratchpad_pb2_grpc
from quarry.vocabulary import Tier
from tests.rpc import error_reason, expect_error, violations
from tests.scratchpad_svc.conftest import finding

Stub = scratchpad_pb2_grpc.ScratchpadServiceStub

AUDIT = CitationAudit(
    sentences=(
        SentenceAudit(sentence_index=0, finding_refs=(1,), judgement=CitationJudgement.UNSOUND, objection="overstated"),
    )
)
RECORDS: dict[int, ResearchRecord] = {
    scratchpad_pb2.ENTRY_KIND_VERDICT: ClaimVerdict(
        finding_ref=1, judgement=ClaimJudgement.UNSUPPORTED, rationale="the page does not say it"
    ),
    scratchpad_pb2.ENTRY_KIND_AUDIT: AUDIT,
    scratchpad_pb2.ENTRY_KIND_OBJECTION: AUDIT.objections(2)[0],
    scratchpad_pb2.ENTRY_KIND_ADJUDICATION: Adjudication(
        objection_ref=3, decision=AdjudicationDecision.REJECT, rationale="the finding says 1889"
    ),
    scratchpad_pb2.ENTRY_KIND_ASSIGNMENT: Assignment(
        delegation_id="run-1:call-1", role=Role.VERIFIER, objective="Verify finding 1.", input_refs=("1",)
    ),
    scratchpad_pb2.ENTRY_KIND_ROUTE: RouteDecision(
        delegation_id="run-1:call-1", worker_id="worker-1", tier=Tier.WORKER, model="scripted"
    ),
    scratchpad_pb2.ENTRY_KIND_USAGE: UsageObserved(
        delegation_id="run-1:call-1", input_tokens=120, output_tokens=30, model_calls=2
    ),
    scratchpad_pb2.ENTRY_KIND_REFUSAL: ClaimRefusal(finding_ref=1, reason="not verified: the verifier failed"),
    scratchpad_pb2.ENTRY_KIND_SENTENCE: DraftSentence(sentence_index=0, text="It is tall [1].", finding_refs=(1,)),
    scratchpad_pb2.ENTRY_KIND_RESOLUTION: ObjectionResolution(
        objection_ref=3, resolution=Resolution.SENTENCE_REMOVED, sentence_index=0, sentence="Gone.", reason="no round"
    ),
    scratchpad_pb2.ENTRY_KIND_BIBLIOGRAPHIC_VERDICT: BibliographicVerdict(
        finding_ref=1,
        cited_url="https://example.org/a",
        judgement=BibliographicJudgement.NOT_FOUND,
        rationale="no catalogue lists it",
    ),
}
S, R, V, A, J, B = (
    common_pb2.ROLE_SUPERVISOR,
    common_pb2.ROLE_RESEARCHER,
    common_pb2.ROLE_VERIFIER,
    common_pb2.ROLE_CITATION_AUDITOR,
    common_pb2.ROLE_ADJUDICATOR,
    common_pb2.ROLE_BIBLIOGRAPHIC_VERIFIER,
)
# The ledger's authority, written out (not derived from the table it checks).
WRITERS: dict[int, set[int]] = {
    scratchpad_pb2.ENTRY_KIND_VERDICT: {V},
    scratchpad_pb2.ENTRY_KIND_AUDIT: {A},
    scratchpad_pb2.ENTRY_KIND_OBJECTION: {A},
    scratchpad_pb2.ENTRY_KIND_ADJUDICATION: {J},
    scratchpad_pb2.ENTRY_KIND_ASSIGNMENT: {S},
    scratchpad_pb2.ENTRY_KIND_ROUTE: {S},
    scratchpad_pb2.ENTRY_KIND_USAGE: {S},
    scratchpad_pb2.ENTRY_KIND_REFUSAL: {S},
    scratchpad_pb2.ENTRY_KIND_SENTENCE: {S},
    scratchpad_pb2.ENTRY_KIND_RESOLUTION: {S},
    scratchpad_pb2.ENTRY_KIND_BIBLIOGRAPHIC_VERDICT: {B},
}


def ledger_entry(thread_id: str, request_id: str, kind: int, role: int, content: str) -> scratchpad_pb2.AppendRequest:
    author = common_pb2.Principal(principal_id=f"p-{role}", role=role)  # type: ignore[arg-type]
    return finding(thread_id, request_id, content, kind=kind, author=author, sources=[])


async def ledger_thread(stub: Stub, make_thread: Callable[[], Awaitable[str]]) -> str:
    """A thread holding what RECORDS refer to: finding 1, audit 2 of it, and objection 3 from that audit."""
    thread_id = await make_thread()
    await stub.Append(finding(thread_id, "finding-1"))
    kind = scratchpad_pb2.ENTRY_KIND_AUDIT
    await stub.Append(ledger_entry(thread_id, "audit-2", kind, A, AUDIT.model_dump_json()))
    kind = scratchpad_pb2.ENTRY_KIND_OBJECTION
    await stub.Append(ledger_entry(thread_id, "objection-3", kind, A, AUDIT.objections(2)[0].model_dump_json()))
    return thread_id


async def test_each_ledger_kind_is_written_only_by_its_role(
    stub: Stub, make_thread: Callable[[], Awaitable[str]]
) -> None:
    thread_id = await ledger_thread(stub, make_thread)
    written, denied = [], []
    for kind, record in RECORDS.items():
        for role in (S, R, V, A, J, B):
            request = ledger_entry(thread_id, f"r-{kind}-{role}", kind, role, record.model_dump_json())
            if role in WRITERS[kind]:
                response = await stub.Append(request)
                written.append((response.entry.kind, response.entry.content))
            else:
                error = await expect_error(stub.Append(request), grpc.StatusCode.PERMISSION_DENIED)
                denied.append(error_reason(error))
    assert written == [(kind, record.model_dump_json()) for kind, record in RECORDS.items()]
    assert denied == ["KIND_NOT_PERMITTED_FOR_ROLE"] * (len(RECORDS) * 6 - len(RECORDS))
    # An auditor does not write verdicts, findings or notes; an adjudicator not even an acknowledgement.
    for kind, role in [
        (scratchpad_pb2.ENTRY_KIND_FINDING, A),
        (scratchpad_pb2.ENTRY_KIND_NOTE, A),
        (scratchpad_pb2.ENTRY_KIND_ACKNOWLEDGEMENT, J),
    ]:
        await expect_error(
            stub.Append(ledger_entry(thread_id, f"x-{kind}-{role}", kind, role, "text")),
            grpc.StatusCode.PERMISSION_DENIED,
        )


async def test_an_objection_is_an_auditors_from_its_audit_or_the_supervisors_from_a_citation_check(
    stub: Stub, make_thread: Callable[[], Awaitable[str]]
) -> None:
    """Both may write ENTRY_KIND_OBJECTION, but neither the other's kind of objection (the table above has
    the supervisor refused an audit's objection)."""
    thread_id = await make_thread()
    checked = Objection(
        check=CitationCheck.INVALID_MARKER, sentence_index=2, reason="it cited a source number that names nothing"
    ).model_dump_json()
    kind = scratchpad_pb2.ENTRY_KIND_OBJECTION
    written = await stub.Append(ledger_entry(thread_id, "by-the-code", kind, S, checked))
    assert written.entry.author.role == S
    for role in (A, R, V, J):
        error = await expect_error(
            stub.Append(ledger_entry(thread_id, f"not-{role}", kind, role, checked)), grpc.StatusCode.PERMISSION_DENIED
        )
        assert error_reason(error) == "KIND_NOT_PERMITTED_FOR_ROLE"
    # An objection names what raised it: an audit or a check, exactly one.
    both = checked.replace('"audit_ref":null', '"audit_ref":1')
    neither = checked.replace('"check":"invalid_marker"', '"check":null')
    for index, content in enumerate((both, neither)):
        error = await expect_error(
            stub.Append(ledger_entry(thread_id, f"bad-{index}", kind, S, content)), grpc.StatusCode.INVALID_ARGUMENT
        )
        assert "raised by an audit (audit_ref) or by a citation check (check)" in violations(error)["content"]


async def test_ledger_content_must_be_the_record_its_kind_names(
    stub: Stub, make_thread: Callable[[], Awaitable[str]]
) -> None:
    thread_id = await make_thread()
    usage = RECORDS[scratchpad_pb2.ENTRY_KIND_USAGE].model_dump_json()
    bad = [
        (scratchpad_pb2.ENTRY_KIND_AUDIT, A, "All sentences look fine."),
        # Another record than the kind holds.
        (scratchpad_pb2.ENTRY_KIND_ROUTE, S, usage),
        # A count that is a string: records are strict.
        (scratchpad_pb2.ENTRY_KIND_USAGE, S, usage.replace('"input_tokens":120', '"input_tokens":"120"')),
        (scratchpad_pb2.ENTRY_KIND_USAGE, S, usage.replace('"schema_version":1', '"schema_version":2')),
    ]
    for index, (kind, role, content) in enumerate(bad):
        error = await expect_error(
            stub.Append(ledger_entry(thread_id, f"bad-{index}", kind, role, content)), grpc.StatusCode.INVALID_ARGUMENT
        )
        assert "content" in violations(error), content
    page = await stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id))
    assert page.last_sequence_no == 0
    # A verdict may still be prose: verifiers wrote them so before records existed.
    prose = await stub.Append(ledger_entry(thread_id, "prose", scratchpad_pb2.ENTRY_KIND_VERDICT, V, "Supported."))
    assert prose.entry.sequence_no == 1


async def test_the_ledger_refuses_references_to_nothing_a_second_resolution_and_an_unassigned_route(
    stub: Stub, make_thread: Callable[[], Awaitable[str]]
) -> None:
    """What would make the ledger fold to something no run decided: each is refused, and nothing is written."""
    thread_id = await ledger_thread(stub, make_thread)
    dangling = [
        (
            scratchpad_pb2.ENTRY_KIND_VERDICT,
            V,
            ClaimVerdict(finding_ref=9, judgement=ClaimJudgement.UNSUPPORTED, rationale="no page"),
            "entry 9 does not exist",
        ),
        (
            scratchpad_pb2.ENTRY_KIND_VERDICT,
            V,
            ClaimVerdict(finding_ref=2, judgement=ClaimJudgement.UNSUPPORTED, rationale="no page"),
            "entry 2 is ENTRY_KIND_AUDIT, not ENTRY_KIND_FINDING",
        ),
        (
            scratchpad_pb2.ENTRY_KIND_ADJUDICATION,
            J,
            Adjudication(objection_ref=1, decision=AdjudicationDecision.REJECT, rationale="no"),
            "entry 1 is ENTRY_KIND_FINDING",
        ),
    ]
    for index, (kind, role, record, problem) in enumerate(dangling):
        error = await expect_error(
            stub.Append(ledger_entry(thread_id, f"dangling-{index}", kind, role, record.model_dump_json())),
            grpc.StatusCode.INVALID_ARGUMENT,
        )
        assert problem in violations(error)["content"]

    resolution = ObjectionResolution(
        objection_ref=3, resolution=Resolution.SENTENCE_REMOVED, sentence_index=0, sentence="Gone.", reason="no round"
    ).model_dump_json()
    kind = scratchpad_pb2.ENTRY_KIND_RESOLUTION
    first = await stub.Append(ledger_entry(thread_id, "resolution", kind, S, resolution))
    again = await stub.Append(ledger_entry(thread_id, "resolution", kind, S, resolution))  # a retry: answered
    assert again.replayed and again.entry.sequence_no == first.entry.sequence_no
    error = await expect_error(
        stub.Append(ledger_entry(thread_id, "resolution-2", kind, S, resolution.replace("Gone.", "Kept."))),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert f"objection 3 is already settled, by entry {first.entry.sequence_no}" in (error.details() or "")

    route = RouteDecision(delegation_id="run-1:never-assigned", worker_id="w", tier=Tier.WORKER, model="m")
    error = await expect_error(
        stub.Append(ledger_entry(thread_id, "route", scratchpad_pb2.ENTRY_KIND_ROUTE, S, route.model_dump_json())),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert "delegation run-1:never-assigned has no assignment" in (error.details() or "")
    page = await stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id))
    assert page.last_sequence_no == first.entry.sequence_no == 4
