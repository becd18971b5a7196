"""Runs that wait for a person's approval: the store, ApproveRun and RejectRun over real gRPC, and a
decision taken by another replica."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest

from quarry.clients.runs import RunsClient
from quarry.config import QuarrySettings, ScratchpadSettings, SupervisorSettings
from quarry.db import Database
from quarry.migrations import open_migrated_database
from quarry.records.research import ClaimJudgement
from quarry.records.verification import (
    FindingCheck,
    ObjectionState,
    SentenceCheck,
    SentenceStatus,
    Verification,
)
from quarry.v1 import common_pb2, scratchpad_pb2, supervisor_pb2
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.runs import events
from supervisor_svc.runs.domain import (
    Approval,
    ApprovalDecision,
    Citation,
    Report,
    ResearchPhase,
    RunOutcome,
    RunState,
    RunUsage,
    StartRequest,
)
from supervisor_svc.runs.store import RunStore
from supervisor_svc.service import MIGRATIONS, VERSION_TABLE
from supervisor_svc.service import build_host as build_supervisor
from tests.conftest import APPROVER_API_KEY, postgres_schema, reusable_port
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography
from tests.fakes.openai_server import Reply, ScriptedModel
from tests.rpc import error_reason, expect_error, violations
from tests.supervisor_svc.conftest import Mesh, answer_at_once, wait_for_phase

AWAITING = supervisor_pb2.RESEARCH_PHASE_AWAITING_APPROVAL
APPROVAL = supervisor_pb2.RunOptions(verification=supervisor_pb2.VERIFICATION_MODE_OFF, require_approval=True)

OBJECTED = Verification(
    enabled=True,
    findings=(FindingCheck(7, "It is 330 m tall.", ClaimJudgement.SUPPORTED, verdict_sequence_no=9),),
    sentences=(SentenceCheck(0, "It is 330 m tall [1].", (7,), SentenceStatus.OBJECTED, (10,)),),
    objections=(ObjectionState(11, 0, "the page gives 324 m"),),
)


async def test_the_store_keeps_verification_the_wait_and_the_first_decision(database_url: str) -> None:
    database = await open_migrated_database(database_url, MIGRATIONS, VERSION_TABLE)
    store = RunStore(database)
    run_id = "run-" + "b" * 32
    try:
        await store.create(run_id, StartRequest("Checked?"), scratchpad_thread_id=run_id, owner="me")
        await store.mark_running(run_id, events.status(ResearchPhase.STARTED, "started"))
        progress = Verification(enabled=True, findings=OBJECTED.findings)
        await store.record_verification(run_id, events.status(ResearchPhase.AUDITING, "auditing"), progress)
        assert (await store.get(run_id)).verification == progress  # type: ignore[union-attr]
        assert not await store.decide(run_id, Approval(ApprovalDecision.APPROVED, "")), "not awaiting yet"
        pending = Report("To decide on.")
        await store.await_approval(run_id, events.status(ResearchPhase.AWAITING_APPROVAL, "waiting"), pending, OBJECTED)
        waiting = await store.get(run_id)
        assert waiting is not None and waiting.state is RunState.AWAITING_APPROVAL and waiting.verification == OBJECTED
        assert waiting.report == pending
        assert waiting.verification.open_objections == OBJECTED.objections and waiting.approval is None
        assert await store.decisions("me", [run_id]) == []
        assert await store.decide(run_id, Approval(ApprovalDecision.REJECTED, "wrong height"))
        assert not await store.decide(run_id, Approval(ApprovalDecision.APPROVED, "fine")), "the first one stands"
        rejected = [(run_id, Approval(ApprovalDecision.REJECTED, "wrong height"))]
        assert await store.decisions("me", [run_id]) == rejected
        assert await store.decisions("someone else", [run_id]) == []
        [listed], _ = await store.list_runs(10, "", RunState.AWAITING_APPROVAL)
        assert listed.run_id == run_id
        cited = Report("It is 330 m tall [1].", (Citation(1, "https://x", "X", "330 m", 7, ClaimJudgement.SUPPORTED),))
        await store.finish(run_id, RunOutcome.succeeded(cited, RunUsage(), verification=OBJECTED))
        ended = await store.get(run_id)
        assert ended is not None and ended.state is RunState.SUCCEEDED and ended.report == cited
        assert ended.approval == Approval(ApprovalDecision.REJECTED, "wrong height")  # kept: a repeat is answered
        assert await store.decisions("me", [run_id]) == []
    finally:
        await database.close()


async def test_an_approved_run_completes_with_its_report_and_the_comment_as_a_note(mesh: Mesh) -> None:
    answer_at_once(mesh, report="The tower is tall.")
    run = await mesh.client.start_run("Approve me?", options=APPROVAL)
    assert run.options.require_approval and run.options.verification == supervisor_pb2.VERIFICATION_MODE_OFF
    await wait_for_phase(mesh, run.run_id, AWAITING)
    waiting = await mesh.client.get_run(run.run_id)
    assert waiting.state == supervisor_pb2.RUN_STATE_AWAITING_APPROVAL
    assert waiting.report.markdown == "The tower is tall."  # what the person decides on
    [listed] = (await mesh.client.list_runs(state=supervisor_pb2.RUN_STATE_AWAITING_APPROVAL)).runs
    assert listed.run_id == run.run_id
    approved = await mesh.approver.approve_run(run.run_id, comment="Looks right to me.")
    assert approved.state == supervisor_pb2.RUN_STATE_SUCCEEDED
    # Who started it and who approved it: the principals of their keys, not anything the requests said.
    assert (approved.created_by, approved.decided_by) == ("tester", "approver")
    assert approved.report.markdown == "The tower is tall."
    events_ = await mesh.events(run.run_id)
    assert events_[-1].completed.report.markdown == "The tower is tall."
    [waited] = [event for event in events_ if event.status.phase == AWAITING]
    assert "no objection is open" in waited.status.message
    entries = await mesh.scratchpad.read_all(run.scratchpad_thread_id)
    [note] = [entry for entry in entries if entry.content.startswith("Approved")]
    assert note.content == "Approved by approver: Looks right to me." and note.kind == scratchpad_pb2.ENTRY_KIND_NOTE
    assert note.author.role == common_pb2.ROLE_SUPERVISOR
    again = await mesh.approver.approve_run(run.run_id, comment="again")  # a repeat returns the run
    assert again.state == supervisor_pb2.RUN_STATE_SUCCEEDED
    error = await expect_error(mesh.client.reject_run(run.run_id, "too late"), grpc.StatusCode.FAILED_PRECONDITION)
    assert f"run {run.run_id} was already approved" in (error.details() or "")


async def test_the_principal_who_started_a_run_may_not_approve_it(mesh: Mesh) -> None:
    answer_at_once(mesh)
    run = await mesh.client.start_run("Approve my own?", options=APPROVAL)  # tester holds every role
    await wait_for_phase(mesh, run.run_id, AWAITING)
    error = await expect_error(mesh.client.approve_run(run.run_id), grpc.StatusCode.PERMISSION_DENIED)
    assert error_reason(error) == "SELF_APPROVAL_NOT_ALLOWED"
    assert "tester started run" in (error.details() or "")
    still = await mesh.client.get_run(run.run_id)
    assert still.state == supervisor_pb2.RUN_STATE_AWAITING_APPROVAL and still.decided_by == ""
    approved = await mesh.approver.approve_run(run.run_id)
    assert approved.state == supervisor_pb2.RUN_STATE_SUCCEEDED and approved.decided_by == "approver"


@pytest.mark.parametrize("supervisor_overrides", [{"allow_self_approval": True}], indirect=True)
async def test_self_approval_is_allowed_when_the_supervisor_says_so(mesh: Mesh) -> None:
    answer_at_once(mesh)
    run = await mesh.client.start_run("Approve my own?", options=APPROVAL)
    await wait_for_phase(mesh, run.run_id, AWAITING)
    approved = await mesh.client.approve_run(run.run_id)
    assert approved.state == supervisor_pb2.RUN_STATE_SUCCEEDED and approved.decided_by == "tester"


async def test_a_rejected_run_fails_with_rejected_and_the_reason(mesh: Mesh) -> None:
    answer_at_once(mesh)
    run = await mesh.client.start_run("Reject me?", options=APPROVAL)
    await wait_for_phase(mesh, run.run_id, AWAITING)
    rejected = await mesh.client.reject_run(run.run_id, reason="The sources are too thin.")
    assert rejected.state == supervisor_pb2.RUN_STATE_FAILED
    assert rejected.error.code == supervisor_pb2.RUN_ERROR_CODE_REJECTED
    assert rejected.error.message == "The sources are too thin." and not rejected.HasField("report")
    events_ = await mesh.events(run.run_id)
    assert events_[-1].failed.error == rejected.error
    again = await mesh.client.reject_run(run.run_id, reason="still no")  # the decision that ended it: returned
    assert again.error.message == "The sources are too thin."
    assert again.decided_by == "tester"  # rejecting one's own run is allowed
    await expect_error(mesh.approver.approve_run(run.run_id), grpc.StatusCode.FAILED_PRECONDITION)


async def test_a_run_awaiting_approval_can_still_be_cancelled(mesh: Mesh) -> None:
    answer_at_once(mesh)
    run = await mesh.client.start_run("Cancel me?", options=APPROVAL)
    await wait_for_phase(mesh, run.run_id, AWAITING)
    database = Database(mesh.supervisor_database_url)
    try:  # what a verifying run saves as it goes: GetRun shows it, the open objection included
        progress = events.status(ResearchPhase.AWAITING_APPROVAL, "objections still open")
        await RunStore(database).record_verification(run.run_id, progress, OBJECTED)
    finally:
        await database.close()
    waiting = await mesh.client.get_run(run.run_id)
    assert waiting.state == supervisor_pb2.RUN_STATE_AWAITING_APPROVAL
    [objection] = waiting.verification.objections
    assert objection.status == supervisor_pb2.OBJECTION_STATUS_OPEN and objection.sentence_index == 0
    cancelled = await mesh.client.cancel_run(run.run_id, reason="no longer needed")
    assert cancelled.state == supervisor_pb2.RUN_STATE_CANCELLED and cancelled.cancel_reason == "no longer needed"
    await expect_error(mesh.approver.approve_run(run.run_id), grpc.StatusCode.FAILED_PRECONDITION)


@pytest.mark.parametrize("supervisor_overrides", [{"approval_wait_seconds": 0.5}], indirect=True)
async def test_a_run_no_one_decides_on_fails_with_deadline_exceeded(mesh: Mesh) -> None:
    answer_at_once(mesh)
    run = await mesh.client.start_run("Forgotten?", options=APPROVAL)
    events_ = await mesh.events(run.run_id)
    assert events_[-1].failed.error.code == supervisor_pb2.RUN_ERROR_CODE_DEADLINE_EXCEEDED
    assert events_[-1].failed.error.message == "no one approved or rejected the run within 0.5 s"


async def test_approval_requests_are_checked(mesh: Mesh) -> None:
    answer_at_once(mesh)
    run = await mesh.client.start_run("Not waiting?")  # no approval asked: it completes by itself
    await mesh.events(run.run_id)
    error = await expect_error(mesh.approver.approve_run(run.run_id), grpc.StatusCode.FAILED_PRECONDITION)
    assert "not awaiting approval" in (error.details() or "")
    error = await expect_error(mesh.client.reject_run("nope", "x\x00" * 600), grpc.StatusCode.INVALID_ARGUMENT)
    assert set(violations(error)) == {"run_id", "reason"}
    await expect_error(mesh.approver.approve_run("run-" + "0" * 32), grpc.StatusCode.NOT_FOUND)
    bad = supervisor_pb2.RunOptions(max_revision_rounds=9)
    error = await expect_error(mesh.client.start_run("Too many rounds?", options=bad), grpc.StatusCode.INVALID_ARGUMENT)
    assert set(violations(error)) == {"options.max_revision_rounds"}


async def test_a_decision_taken_by_another_replica_reaches_the_run(tmp_path: Path, model: ScriptedModel) -> None:
    script = Choreography()
    model.default = script
    script.add(SUPERVISOR, Reply(content="Nothing to delegate."))
    script.add(REPORT, Reply(content="Awaiting a person."))
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1)
    with postgres_schema() as schema:
        async with await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common) as scratchpad:

            def replica() -> SupervisorSettings:
                return SupervisorSettings(
                    address="127.0.0.1:0",
                    database_url=schema.url,
                    scratchpad_address=scratchpad.address,
                    worker_addresses=f"127.0.0.1:{reusable_port()}",  # this run delegates nothing
                    model_base_url=model.base_url,
                    model_name="scripted",
                )

            owner = await build_supervisor(replica(), common)
            other = await build_supervisor(replica(), common)
            async with (
                owner,
                other,
                RunsClient.connect(owner.address) as a,
                RunsClient.connect(other.address, api_key=APPROVER_API_KEY) as b,
            ):
                run = await a.start_run("Who approves?", options=APPROVAL)
                async for event in b.stream_run(run.run_id):
                    if event.status.phase == AWAITING:
                        break
                approved = await asyncio.wait_for(b.approve_run(run.run_id, comment="From the other side."), 30)
    assert approved.state == supervisor_pb2.RUN_STATE_SUCCEEDED, "the owner got the decision on a lease renewal"
    assert approved.report.markdown == "Awaiting a person."


def test_the_completed_event_and_the_run_carry_the_verification_and_each_citations_judgement() -> None:
    cited = Report("It is 330 m tall [1].", (Citation(1, "https://x", "X", "330 m", 7, ClaimJudgement.SUPPORTED),))
    unverified = FindingCheck(8, "It is red.", None)
    verification = replace(OBJECTED, findings=(*OBJECTED.findings, unverified), revision_rounds=1)
    payload = events.ending(RunOutcome.succeeded(cited, RunUsage(), verification=verification)).stored(
        "run-" + "c" * 32, 5, datetime.now(UTC)
    )
    completed = supervisor_pb2.RunEvent.FromString(payload).completed
    assert completed.report.citations[0].judgement == supervisor_pb2.CLAIM_JUDGEMENT_SUPPORTED
    shown = completed.verification
    assert shown.enabled and shown.revision_rounds == 1 and shown.supported_claims == 0
    assert [(f.judgement, f.citable) for f in shown.findings] == [
        (supervisor_pb2.CLAIM_JUDGEMENT_SUPPORTED, True),
        (supervisor_pb2.CLAIM_JUDGEMENT_UNVERIFIED, False),
    ]
    [sentence] = shown.sentences
    assert sentence.status == supervisor_pb2.SENTENCE_STATUS_OBJECTED and list(sentence.finding_sequence_nos) == [7]
    [objection] = shown.objections
    assert objection.status == supervisor_pb2.OBJECTION_STATUS_OPEN and objection.reason == "the page gives 324 m"
    uncited = Report("Plain.", (Citation(1, "https://x", "X", "330 m", 7),))
    plain = events.ending(RunOutcome.succeeded(uncited, RunUsage())).stored("run-" + "c" * 32, 5, datetime.now(UTC))
    unverified_run = supervisor_pb2.RunEvent.FromString(plain).completed
    assert not unverified_run.HasField("verification")
    assert unverified_run.report.citations[0].judgement == supervisor_pb2.CLAIM_JUDGEMENT_UNSPECIFIED
