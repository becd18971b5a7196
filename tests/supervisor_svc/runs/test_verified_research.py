"""Verified research end to end, across real processes: blind claim verification, citation audit,
objections settled by revision and by adjudication, refused and repaired outputs, and the ledger.

Supervisor, two workers and the scratchpad run as `quarry serve` processes with mesh tokens; the model
is the scripted OpenAI-compatible server (tests/fakes/evidence.py scripts the evidence roles), the web
the local fixture site. The tests share one mesh, model server and site: each run has its own
thread and its own script.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from quarry.clients.channels import open_channel
from quarry.clients.runs import RunsClient
from quarry.clients.scratchpad import ScratchpadClient
from quarry.convert import entry_from_proto, verification_to_proto
from quarry.records.fold import fold_ledger
from quarry.records.research import (
    Assignment,
    CitationCheck,
    ClaimVerdict,
    Objection,
    ObjectionResolution,
    Resolution,
    RouteDecision,
    UsageObserved,
    parse_record,
)
from quarry.v1 import common_pb2, scratchpad_pb2, supervisor_pb2
from quarry.vocabulary import EntryKind
from tests.conftest import APPROVER_API_KEY
from tests.fakes.choreography import REPORT
from tests.fakes.evidence import (
    AUDIT_FAILS,
    EARLY,
    GUIDE,
    HEIGHT,
    OPENED,
    OPENING,
    QUESTION,
    S_DISPUTED,
    S_OPENED,
    S_REJECTED,
    S_UPHELD,
    S_WRONG,
    S_WRONG_REVISED,
    TALL,
    TALLEST,
    UNDECIDED,
    EvidenceScript,
    add_pages,
    marked,
    research,
    shown,
    task_of,
    tower_scenario,
    verdict,
)
from tests.fakes.openai_server import Call, Reply, ScriptedModel, Step
from tests.fakes.web_server import FixtureWeb
from tests.quarry.cli.test_cli import finish, quarry
from tests.supervisor_svc.conftest import ProcessMesh, processes

pytestmark = pytest.mark.slow

PUBLIC_PAYLOADS = {"status", "scratchpad", "reasoning", "content", "completed", "failed", "cancelled"}
INTERNAL_TOOLS = (
    "delegate_research",
    "read_scratchpad",
    "append_scratchpad",
    "read_web_page",
    "submit_claim_verdict",
    "submit_citation_audit",
    "submit_adjudication",
)


@pytest.fixture(scope="module")
def mesh(
    tmp_path_factory: pytest.TempPathFactory, shared_model: ScriptedModel, shared_site: FixtureWeb
) -> Iterator[ProcessMesh]:
    with processes(tmp_path_factory.mktemp("mesh"), shared_model, shared_site) as mesh:
        yield mesh


@pytest.fixture
def site(shared_site: FixtureWeb) -> FixtureWeb:
    return shared_site


@pytest.fixture
def script(shared_model: ScriptedModel, site: FixtureWeb) -> EvidenceScript:
    choreography = EvidenceScript(site_url=site.base_url)
    shared_model.forget()
    shared_model.default = choreography
    add_pages(site)
    return choreography


async def verified_run(
    mesh: ProcessMesh, *routes: supervisor_pb2.RoleRoute
) -> tuple[list[supervisor_pb2.RunEvent], supervisor_pb2.Run, list[scratchpad_pb2.Entry]]:
    async with RunsClient.connect(mesh.supervisor.address) as client:
        options = supervisor_pb2.RunOptions(verification=supervisor_pb2.VERIFICATION_MODE_ON, role_routes=routes)
        run = await client.start_run(QUESTION, options=options)
        events = [event async for event in client.stream_run(run.run_id)]
        stored = await client.get_run(run.run_id)
    async with open_channel(mesh.scratchpad.address, token=mesh.supervisor_token) as channel:
        entries = await ScratchpadClient(channel).read_all(run.scratchpad_thread_id)
    assert_ledger_folds_to(entries, stored)
    return events, stored, entries


def assert_ledger_folds_to(entries: list[scratchpad_pb2.Entry], run: supervisor_pb2.Run) -> None:
    """The run's ledger, folded as any reader would fold it, is exactly the verification GetRun serves, and the
    report's body says what that verification says of each sentence (the body is built from what the review
    decided, the verification from the ledger)."""
    assert verification_to_proto(fold_ledger([entry_from_proto(e) for e in entries])) == run.verification
    if not run.HasField("report"):
        return
    body = run.report.markdown.split("## How each claim was verified")[0]
    for sentence in run.verification.sentences:
        if sentence.status == supervisor_pb2.SENTENCE_STATUS_REMOVED:
            assert sentence.text not in body, sentence
        elif sentence.status == supervisor_pb2.SENTENCE_STATUS_UNAUDITED:
            assert f"(unverified) {sentence.text}" in body, sentence
        else:
            assert sentence.text in body and f"(unverified) {sentence.text}" not in body, sentence


def two_supported_findings(script: EvidenceScript, site: FixtureWeb) -> None:
    """A researcher promotes OPENED and TALL, and each one's verifier judges it supported."""
    research(script, site, OPENED, TALL)
    script.verdicts = {
        OPENED[0]: verdict("supported", OPENED[2], OPENING[0], "the page gives the opening date"),
        TALL[0]: verdict("supported", TALL[2], HEIGHT[0], "the page gives the height"),
    }


async def test_a_verified_run_cites_only_supported_claims_surfaces_disagreement_and_settles_every_objection(
    mesh: ProcessMesh, site: FixtureWeb, script: EvidenceScript
) -> None:
    tower_scenario(script, site)

    events, stored, entries = await verified_run(mesh)

    payloads = [event.WhichOneof("payload") for event in events]
    assert script.unanswered == []
    assert payloads[-1] == "completed", events[-1]
    completed = events[-1].completed
    verification = completed.verification
    findings = {e.content: e.sequence_no for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_FINDING}
    assert len(findings) == 4 and {f"Verify finding {n}" for n in findings.values()} <= set(script.requests)

    # Claims: each finding judged by its own blind verifier; only supported ones are cited.
    judged = {check.claim: check for check in verification.findings}
    assert {claim: check.judgement for claim, check in judged.items()} == {
        OPENED[0]: supervisor_pb2.CLAIM_JUDGEMENT_SUPPORTED,
        TALL[0]: supervisor_pb2.CLAIM_JUDGEMENT_SUPPORTED,
        TALLEST[0]: supervisor_pb2.CLAIM_JUDGEMENT_UNSUPPORTED,
        EARLY[0]: supervisor_pb2.CLAIM_JUDGEMENT_CONTRADICTED,
    }
    # The contradicted finding and the one quoting the page that says otherwise: both contested, both citable.
    assert {claim for claim, check in judged.items() if check.citable} == {OPENED[0], TALL[0], EARLY[0]}
    assert {claim for claim, check in judged.items() if check.contested} == {OPENED[0], EARLY[0]}
    cited = {c.scratchpad_sequence_no for c in completed.report.citations}
    assert cited == {findings[OPENED[0]], findings[TALL[0]], findings[EARLY[0]]}  # never the overstated one
    assert {c.judgement for c in completed.report.citations} == {
        supervisor_pb2.CLAIM_JUDGEMENT_SUPPORTED,
        supervisor_pb2.CLAIM_JUDGEMENT_CONTRADICTED,
    }
    [contradiction] = verification.contradictions
    assert list(contradiction.contradicting_finding_sequence_nos) == [findings[OPENED[0]]]
    assert (contradiction.finding_sequence_no, contradiction.claim) == (findings[EARLY[0]], EARLY[0])
    assert contradiction.finding_url == site.base_url + GUIDE[0] and contradiction.finding_excerpt == EARLY[2]
    assert contradiction.contradicting_url == site.base_url + OPENING[0]
    assert contradiction.contradicting_excerpt == OPENED[2]

    # Sentences: the disagreement sound; one side cited alone objected to by the code and revised; one
    # removed by the adjudicator, one upheld by it.
    statuses = [(s.text, s.status) for s in verification.sentences]
    assert statuses == [
        (S_DISPUTED, supervisor_pb2.SENTENCE_STATUS_SOUND),
        (S_WRONG_REVISED, supervisor_pb2.SENTENCE_STATUS_REVISED),
        (S_REJECTED, supervisor_pb2.SENTENCE_STATUS_REMOVED),
        (S_UPHELD, supervisor_pb2.SENTENCE_STATUS_UPHELD),
    ]
    assert sorted(o.status for o in verification.objections) == sorted(
        [
            supervisor_pb2.OBJECTION_STATUS_REVISED,
            supervisor_pb2.OBJECTION_STATUS_SENTENCE_REMOVED,
            supervisor_pb2.OBJECTION_STATUS_DISMISSED,
        ]
    )
    assert all(o.resolution_sequence_no for o in verification.objections)
    assert (verification.supported_claims, verification.removed_claims, verification.contested_claims) == (3, 1, 1)
    assert verification.revision_rounds >= 1

    # The report: the revision in, the rejected sentence out, the disagreement and the verification stated.
    markdown = completed.report.markdown
    body, stated = markdown.split("## How each claim was verified")
    assert body.strip() == f"## The tower\n\n{S_DISPUTED} {S_WRONG_REVISED} {S_UPHELD}"
    assert "## Where sources disagree" in stated and site.base_url + GUIDE[0] in stated
    assert "tallest structure in the world" not in markdown  # the unsupported claim is nowhere
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED and stored.verification == verification
    assert stored.report == completed.report
    assert completed.usage.verification.model_calls > 0
    assert completed.usage.workers.model_calls > completed.usage.verification.model_calls

    # Blind contracts, from the model server's request log.
    for agent, requests in script.requests.items():
        seen = json.dumps([r["messages"] for r in requests])
        if agent.startswith(("Verify finding", "Audit sentence", "Adjudicate objection")):
            assert "SUPERVISOR-NOTE" not in seen, agent  # never the supervisor's conclusions
            assert "the page gives" not in seen, agent  # never another verifier's verdict
            assert "ADJUDICATE:" not in seen, agent  # never the supervisor's case against an objection
        if agent.startswith("Audit sentence"):
            sentences = {marked(s).rstrip(".") for s in (S_DISPUTED, S_WRONG, S_WRONG_REVISED, S_REJECTED, S_UPHELD)}
            [own] = {shown(task_of(request)).rstrip(".") for request in requests}
            # (What the verifiers read is shown too, and may say what another sentence says: not counted here.)
            tasks = re.sub(r'claim-verifier read on \S+: ".*?"\.', "", "".join(task_of(r) for r in requests))
            assert own in sentences and not any(other in tasks for other in sentences - {own}), agent

    # Auditors and adjudicators see what each cited finding's verifier read, beside the claim (not its verdict).
    def tasks(prefix: str) -> list[str]:
        return [
            task_of(body) for agent, bodies in script.requests.items() if agent.startswith(prefix) for body in bodies
        ]

    opened_quote = f'claim-verifier read on {site.base_url}{OPENING[0]}: "{OPENED[2]}"'
    height_quote = f'claim-verifier read on {site.base_url}{HEIGHT[0]}: "{TALL[2]}"'
    assert any(opened_quote in task for task in tasks("Audit sentence"))
    assert tasks("Adjudicate objection") and all(height_quote in task for task in tasks("Adjudicate objection"))
    # ...and the contradiction a cited finding is a side of.
    [disputed] = [task for task in tasks("Audit sentence") if "while a guide says 1887" in task]
    assert f"Finding {findings[OPENED[0]]} is contested" in disputed and "citing both sides" in disputed
    # The sentence citing one side alone was never audited as written: the supervisor's check objected to it.
    assert not any(marked(S_WRONG) in task for task in tasks("Audit sentence"))
    checked = [
        parse_record(EntryKind.OBJECTION, e.content)
        for e in entries
        if e.kind == scratchpad_pb2.ENTRY_KIND_OBJECTION and e.author.role == common_pb2.ROLE_SUPERVISOR
    ]
    assert [(o.check, o.sentence_index) for o in checked if isinstance(o, Objection)] == [(CitationCheck.ONE_SIDED, 2)]

    # The ledger: gap-free, each delegation assigned, routed and its usage observed; each objection resolved.
    assert [e.sequence_no for e in entries] == list(range(1, len(entries) + 1))
    assignments = [Assignment.parse(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_ASSIGNMENT]
    usages = [UsageObserved.parse(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_USAGE]
    routes = [e for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_ROUTE]
    assert len(assignments) == len(usages) == len(routes)
    assert {a.delegation_id for a in assignments} == {u.delegation_id for u in usages}  # type: ignore[union-attr]
    roles = sorted(a.role.value for a in assignments)  # type: ignore[union-attr]
    assert roles.count("verifier") == 4 and roles.count("adjudicator") == 2 and roles.count("researcher") == 1
    assert roles.count("citation_auditor") == 4  # three sentences and one revision
    for assignment in assignments:
        first = next(e for e in entries if assignment.delegation_id in e.content)  # type: ignore[union-attr]
        assert first.kind == scratchpad_pb2.ENTRY_KIND_ASSIGNMENT  # written before anything the delegation did
    resolutions = [
        parse_record(EntryKind.RESOLUTION, e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_RESOLUTION
    ]
    objections = [e.sequence_no for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_OBJECTION]
    assert sorted(r.objection_ref for r in resolutions if isinstance(r, ObjectionResolution)) == objections
    # Every way the review settles an objection (a person's approval is the last test's).
    settled = {r.resolution for r in resolutions if isinstance(r, ObjectionResolution)}
    assert settled == set(Resolution) - {Resolution.APPROVED_BY_PERSON}

    # Anyone who may read the run can fold its ledger again and find what GetRun serves.
    code, said = await finish(await quarry("runs", "verify", stored.run_id, "--address", mesh.supervisor.address))
    assert code == 0, said
    assert "folds to exactly the verification it serves: 4 findings, 4 sentences, 3 objections" in " ".join(
        said.split()
    )

    # Every event still passes the client-boundary rules.
    phases = {e.status.phase for e in events if e.HasField("status")}
    assert {
        supervisor_pb2.RESEARCH_PHASE_VERIFYING_CLAIMS,
        supervisor_pb2.RESEARCH_PHASE_AUDITING,
        supervisor_pb2.RESEARCH_PHASE_REVISING,
        supervisor_pb2.RESEARCH_PHASE_ADJUDICATING,
    } <= phases
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1))
    assert set(payloads) <= PUBLIC_PAYLOADS and payloads.count("completed") == 1
    serialized = b"".join(event.SerializeToString() for event in events)
    assert not any(name.encode() in serialized for name in INTERNAL_TOOLS)


async def test_in_a_run_a_refused_verifier_leaves_its_finding_uncited_and_a_malformed_one_is_repaired(
    mesh: ProcessMesh, site: FixtureWeb, script: EvidenceScript
) -> None:
    research(script, site, OPENED, TALL)
    refusals: list[str] = []

    def oversteps(finding: int, site_url: str) -> Step:
        """First a finding (not a verifier's to emit), then a verdict on an entry outside its contract."""
        if not refusals:
            refusals.append("finding")
            finding_arguments = {
                "content": "It is tall.",
                "sources": [{"url": site_url + HEIGHT[0], "excerpt": TALL[2]}],
            }
            return Reply(calls=(Call("submit_finding", finding_arguments, "own"),))
        refusals.append("outside")
        arguments = {"finding_ref": finding + 40, "judgement": "unsupported", "rationale": "another entry"}
        return Reply(calls=(Call("submit_claim_verdict", arguments, "outside"),))

    malformed: list[str] = []

    def repaired(finding: int, site_url: str) -> Step:
        """First without its rationale, then whole."""
        quote = {"url": site_url + OPENING[0], "excerpt": OPENED[2]}
        arguments: dict[str, Any] = {"finding_ref": finding, "judgement": "supported", "quote": quote}
        if not malformed:
            malformed.append("no rationale")
            return Reply(calls=(Call("submit_claim_verdict", arguments, "bad"),))
        return Reply(calls=(Call("submit_claim_verdict", {**arguments, "rationale": "as the page says"}, "good"),))

    script.verdicts = {OPENED[0]: repaired, TALL[0]: oversteps}
    script.add(REPORT, Reply(content=f"{S_OPENED} It is 330 metres tall [2]."))
    script.audits = {marked(S_OPENED): ("sound", "")}
    script.revisions = {"It is 330 metres tall": "REMOVE"}

    events, stored, entries = await verified_run(mesh)

    assert script.unanswered == []
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    completed = events[-1].completed
    assert refusals == ["finding", "outside"] and malformed == ["no rationale"]
    failures = [e.status.delegation_error for e in events if e.HasField("status") and e.status.delegation_error.code]
    assert [f.code for f in failures] == [common_pb2.DELEGATION_ERROR_CODE_OUTPUT_REFUSED]
    judged = {check.claim: check for check in completed.verification.findings}
    assert judged[OPENED[0]].judgement == supervisor_pb2.CLAIM_JUDGEMENT_SUPPORTED
    assert judged[TALL[0]].judgement == supervisor_pb2.CLAIM_JUDGEMENT_UNVERIFIED and not judged[TALL[0]].citable
    # Only the repaired verifier recorded a verdict; the refused one recorded nothing, and is never cited.
    [recorded] = [ClaimVerdict.parse(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_VERDICT]
    findings = {e.content: e.sequence_no for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_FINDING}
    assert isinstance(recorded, ClaimVerdict) and recorded.finding_ref == findings[OPENED[0]]
    assert [c.url for c in completed.report.citations] == [site.base_url + OPENING[0]]
    # [2] named no citable finding: the code objected to its sentence, which was withdrawn, not left uncited.
    assert completed.report.markdown.split("##")[0].strip() == S_OPENED
    [objection] = completed.verification.objections
    assert objection.status == supervisor_pb2.OBJECTION_STATUS_SENTENCE_REMOVED
    assert "names no verified finding" in objection.reason
    assert not any(
        e.kind == scratchpad_pb2.ENTRY_KIND_FINDING and e.author.role == common_pb2.ROLE_VERIFIER for e in entries
    )
    assert stored.verification == completed.verification
    # The finding no verifier could judge is a review that did not finish: the run says so.
    incomplete = supervisor_pb2.RUN_WARNING_CODE_VERIFICATION_INCOMPLETE
    assert [w.code for w in completed.warnings] == [incomplete] == [w.code for w in stored.warnings]


async def test_a_model_that_cannot_follow_the_roles_contracts_is_named_with_verification_off(
    mesh: ProcessMesh, site: FixtureWeb, script: EvidenceScript
) -> None:
    """Every verifier answers in prose instead of submitting its verdict, repair turn included: the run says the
    model cannot play the roles and names verification off, rather than ending with a bare report."""

    def chats(finding: int, site_url: str) -> Step:
        return Reply(content="Looks right to me.")

    research(script, site, OPENED, TALL)
    script.verdicts = {OPENED[0]: chats, TALL[0]: chats}
    script.add(REPORT, Reply(content="## The tower\n\nNothing could be verified."))

    events, stored, _ = await verified_run(mesh)

    completed = events[-1].completed
    failures = [
        e.status.delegation_error.code for e in events if e.HasField("status") and e.status.delegation_error.code
    ]
    assert failures == [common_pb2.DELEGATION_ERROR_CODE_OUTPUT_INVALID] * 2
    codes = [w.code for w in completed.warnings]
    assert (
        codes
        == [w.code for w in stored.warnings]
        == [
            supervisor_pb2.RUN_WARNING_CODE_NO_SOURCES,
            supervisor_pb2.RUN_WARNING_CODE_VERIFICATION_INCOMPLETE,
            supervisor_pb2.RUN_WARNING_CODE_ROLES_CANNOT_FOLLOW_CONTRACTS,
        ]
    )
    [roles] = [w for w in completed.warnings if w.code == codes[-1]]
    assert "cannot play those roles" in roles.message and "--verification off" in roles.message


async def test_a_run_routes_its_claim_verifiers_to_the_strong_tier_and_the_ledger_records_it(
    mesh: ProcessMesh, site: FixtureWeb, script: EvidenceScript
) -> None:
    two_supported_findings(script, site)
    script.add(REPORT, Reply(content=f"## The tower\n\n{S_OPENED}"))
    script.audits = {marked(S_OPENED): ("sound", "")}
    strong = supervisor_pb2.RoleRoute(role=common_pb2.ROLE_VERIFIER, tier=common_pb2.MODEL_TIER_SUPERVISOR)

    _, stored, entries = await verified_run(mesh, strong)

    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED
    assert list(stored.options.role_routes) == [strong]
    roles = {}
    for entry in entries:
        if entry.kind == scratchpad_pb2.ENTRY_KIND_ASSIGNMENT:
            assigned = Assignment.parse(entry.content)
            assert isinstance(assigned, Assignment)
            roles[assigned.delegation_id] = assigned.role.value
    tiers = {}
    for entry in entries:
        if entry.kind == scratchpad_pb2.ENTRY_KIND_ROUTE:
            route = parse_record(EntryKind.ROUTE, entry.content)
            assert isinstance(route, RouteDecision)
            tiers.setdefault(roles[route.delegation_id], set()).add(route.tier.value)
    # The verifiers ran on the supervisor tier, as the run asked; the others on their defaults.
    assert tiers == {"researcher": {"worker"}, "verifier": {"supervisor"}, "citation_auditor": {"supervisor"}}


OBJECTED = "stands high is not what the finding says"


async def test_a_sentence_no_auditor_judged_is_marked_unverified_in_the_body_and_the_run_warns(
    mesh: ProcessMesh, site: FixtureWeb, script: EvidenceScript
) -> None:
    two_supported_findings(script, site)
    script.add(REPORT, Reply(content=f"## The tower\n\n{S_OPENED} {S_WRONG_REVISED}"))
    script.audits = {marked(S_OPENED): ("sound", ""), marked(S_WRONG_REVISED): (AUDIT_FAILS, "")}

    events, stored, _ = await verified_run(mesh)

    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED, events[-1]
    statuses = {s.text: s.status for s in stored.verification.sentences}
    assert statuses == {
        S_OPENED: supervisor_pb2.SENTENCE_STATUS_SOUND,
        S_WRONG_REVISED: supervisor_pb2.SENTENCE_STATUS_UNAUDITED,
    }
    # Failed closed: the body itself says which sentence stands on no audit, and the run says so too.
    body = stored.report.markdown.split("## How each claim was verified")[0]
    assert body.strip() == f"## The tower\n\n{S_OPENED} (unverified) {S_WRONG_REVISED}"
    codes = [w.code for w in events[-1].completed.warnings]
    assert codes == [supervisor_pb2.RUN_WARNING_CODE_VERIFICATION_INCOMPLETE] == [w.code for w in stored.warnings]


def unsettled_objection(script: EvidenceScript, site: FixtureWeb) -> None:
    """Two supported findings, a draft of two sentences: one sound, one objected to, contested, and left
    undecided by an adjudicator whose model call fails."""
    two_supported_findings(script, site)
    script.add(REPORT, Reply(content=f"## The tower\n\n{S_OPENED} {S_UPHELD}"))
    script.audits = {marked(S_OPENED): ("sound", ""), marked(S_UPHELD): ("unsound", OBJECTED)}
    script.revisions = {S_UPHELD: "ADJUDICATE: standing 330 metres high is being 330 metres tall"}
    script.decisions = {marked(S_UPHELD): UNDECIDED}


async def awaiting_approval(client: RunsClient) -> supervisor_pb2.Run:
    """A verified run started with require_approval (one revision round), once it awaits approval."""
    options = supervisor_pb2.RunOptions(
        verification=supervisor_pb2.VERIFICATION_MODE_ON, require_approval=True, max_revision_rounds=1
    )
    run = await client.start_run(QUESTION, options=options)
    for _ in range(600):  # at most a minute
        run = await client.get_run(run.run_id)
        if run.state not in (supervisor_pb2.RUN_STATE_QUEUED, supervisor_pb2.RUN_STATE_RUNNING):
            break
        await asyncio.sleep(0.1)
    assert run.state == supervisor_pb2.RUN_STATE_AWAITING_APPROVAL, run
    return run


async def test_an_objection_the_review_cannot_settle_blocks_approval_unless_approved_over_with_a_reason(
    mesh: ProcessMesh, site: FixtureWeb, script: EvidenceScript
) -> None:
    unsettled_objection(script, site)
    comment = "Standing 330 m high is being 330 m tall."

    async with (
        RunsClient.connect(mesh.supervisor.address) as client,
        RunsClient.connect(mesh.supervisor.address, api_key=APPROVER_API_KEY) as approver,
    ):
        waiting = await awaiting_approval(client)
        # A plain approval is refused, naming the objection; approving over it needs a reason.
        with pytest.raises(grpc.aio.AioRpcError) as plain:
            await approver.approve_run(waiting.run_id, comment=comment)
        with pytest.raises(grpc.aio.AioRpcError) as unexplained:
            await approver.approve_run(waiting.run_id, over_objections=True)
        still_waiting = await client.get_run(waiting.run_id)
        approved = await approver.approve_run(waiting.run_id, comment=comment, over_objections=True)
        events = [event async for event in client.stream_run(waiting.run_id)]
    async with open_channel(mesh.scratchpad.address, token=mesh.supervisor_token) as channel:
        entries = await ScratchpadClient(channel).read_all(waiting.scratchpad_thread_id)

    assert script.unanswered == []
    [adjudication] = [agent for agent in script.requests if agent.startswith("Adjudicate objection ")]
    assert len(script.requests[adjudication]) == 1  # its one model call failed; no adjudication was recorded
    assert not any(e.kind == scratchpad_pb2.ENTRY_KIND_ADJUDICATION for e in entries)

    # While it waits: the objection open, its sentence in, and both listed.
    [sentence] = [s for s in waiting.verification.sentences if s.text == S_UPHELD]
    assert sentence.status == supervisor_pb2.SENTENCE_STATUS_OBJECTED
    [objection] = waiting.verification.objections
    assert (objection.status, objection.sentence_index, objection.reason) == (
        supervisor_pb2.OBJECTION_STATUS_OPEN,
        sentence.sentence_index,
        OBJECTED,
    )
    assert not objection.resolution_sequence_no
    # The report the person decides on: the sentence objected to in it, marked so in its verification section.
    assert S_UPHELD in waiting.report.markdown and "the objection is still open" in waiting.report.markdown
    [awaiting] = [e.status for e in events if e.status.phase == supervisor_pb2.RESEARCH_PHASE_AWAITING_APPROVAL]
    assert f"1 objection(s) still open: sentence {sentence.sentence_index}: {OBJECTED}" in awaiting.message

    assert plain.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"objection {objection.objection_sequence_no} against sentence {sentence.sentence_index}" in (
        plain.value.details() or ""
    )
    assert "--over-objections" in (plain.value.details() or "")
    assert unexplained.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert still_waiting.state == supervisor_pb2.RUN_STATE_AWAITING_APPROVAL

    # Approved over the objection: it is resolved, and its sentence stays as written, never counted as supported.
    assert approved.state == supervisor_pb2.RUN_STATE_SUCCEEDED
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    completed = events[-1].completed
    verification = completed.verification
    assert approved.verification == verification and approved.report == completed.report
    [closed] = verification.objections
    assert closed.objection_sequence_no == objection.objection_sequence_no
    assert closed.status == supervisor_pb2.OBJECTION_STATUS_APPROVED_BY_PERSON and closed.resolution_sequence_no
    assert [(s.text, s.status) for s in verification.sentences] == [
        (S_OPENED, supervisor_pb2.SENTENCE_STATUS_SOUND),
        (S_UPHELD, supervisor_pb2.SENTENCE_STATUS_APPROVED_OVER_OBJECTION),
    ]
    # The claim only the approved-over sentence states is not counted as supported.
    assert (verification.supported_claims, verification.removed_claims) == (1, 0)
    body, stated = completed.report.markdown.split("## How each claim was verified")
    assert body.strip() == f"## The tower\n\n{S_OPENED} {S_UPHELD}"
    assert "not supported: the review left the objection open, and a person approved the run over it" in stated
    assert "still open" not in stated

    # The ledger: the resolution, the approver's comment its reason, then the approval's note.
    [resolution_entry] = [e for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_RESOLUTION]
    assert resolution_entry.sequence_no == closed.resolution_sequence_no
    assert resolution_entry.author.role == common_pb2.ROLE_SUPERVISOR
    resolution = ObjectionResolution.parse(resolution_entry.content)
    assert isinstance(resolution, ObjectionResolution)
    assert (resolution.resolution, resolution.objection_ref, resolution.reason, resolution.sentence) == (
        Resolution.APPROVED_BY_PERSON,
        objection.objection_sequence_no,
        f"approved over the objection by approver: {comment}",
        S_UPHELD,
    )
    [note] = [e for e in entries if e.content.startswith("Approved by approver")]
    assert note.sequence_no > resolution_entry.sequence_no
    assert [e.sequence_no for e in entries] == list(range(1, len(entries) + 1))
    assert_ledger_folds_to(entries, approved)
    # While it waited, too: the ledger up to the person's resolution folds to what GetRun served then.
    before = [e for e in entries if e.sequence_no < resolution_entry.sequence_no]
    assert_ledger_folds_to(before, waiting)


async def test_a_rejected_run_fails_and_leaves_the_objection_open(
    mesh: ProcessMesh, site: FixtureWeb, script: EvidenceScript
) -> None:
    unsettled_objection(script, site)

    async with RunsClient.connect(mesh.supervisor.address) as client:
        waiting = await awaiting_approval(client)
        rejected = await client.reject_run(waiting.run_id, reason="Standing high is not being tall.")
        events = [event async for event in client.stream_run(waiting.run_id)]
    async with open_channel(mesh.scratchpad.address, token=mesh.supervisor_token) as channel:
        entries = await ScratchpadClient(channel).read_all(waiting.scratchpad_thread_id)

    assert script.unanswered == []
    assert rejected.state == supervisor_pb2.RUN_STATE_FAILED and not rejected.HasField("report")
    assert rejected.error.code == supervisor_pb2.RUN_ERROR_CODE_REJECTED and events[-1].failed.error == rejected.error
    [objection] = rejected.verification.objections
    assert objection.status == supervisor_pb2.OBJECTION_STATUS_OPEN and objection.reason == OBJECTED
    assert rejected.verification == waiting.verification
    assert not any(e.kind == scratchpad_pb2.ENTRY_KIND_RESOLUTION for e in entries)
    assert_ledger_folds_to(entries, rejected)
