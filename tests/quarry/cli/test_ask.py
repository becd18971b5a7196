"""How `quarry ask` ends: its exit status for each way a run ends."""

from __future__ import annotations

from quarry.cli.ask import EXIT_CANCELLED, EXIT_FAILED, EXIT_UNVERIFIED, exit_code
from quarry.cli.runs import verification_differences
from quarry.v1 import supervisor_pb2


def completed(*codes: supervisor_pb2.RunWarningCode.ValueType) -> supervisor_pb2.RunEvent:
    event = supervisor_pb2.RunEvent()
    event.completed.warnings.extend(supervisor_pb2.RunWarning(code=code) for code in codes)
    return event


def test_a_run_whose_review_did_not_finish_exits_with_its_own_status() -> None:
    assert exit_code(completed()) == 0
    assert exit_code(completed(supervisor_pb2.RUN_WARNING_CODE_NO_SOURCES)) == 0
    incomplete = completed(
        supervisor_pb2.RUN_WARNING_CODE_USAGE_ESTIMATED, supervisor_pb2.RUN_WARNING_CODE_VERIFICATION_INCOMPLETE
    )
    assert exit_code(incomplete) == EXIT_UNVERIFIED == 3
    assert exit_code(completed(supervisor_pb2.RUN_WARNING_CODE_ROLES_CANNOT_FOLLOW_CONTRACTS)) == EXIT_UNVERIFIED
    assert len({0, EXIT_UNVERIFIED, EXIT_FAILED, EXIT_CANCELLED}) == 4
    failed, cancelled = supervisor_pb2.RunEvent(), supervisor_pb2.RunEvent()
    failed.failed.SetInParent()
    cancelled.cancelled.SetInParent()
    assert (exit_code(failed), exit_code(cancelled), exit_code(None)) == (EXIT_FAILED, EXIT_CANCELLED, EXIT_FAILED)


def test_runs_verify_names_each_part_where_the_ledger_and_the_served_verification_differ() -> None:
    served = supervisor_pb2.Verification(enabled=True, supported_claims=1)
    served.findings.add(finding_sequence_no=3, judgement=supervisor_pb2.CLAIM_JUDGEMENT_SUPPORTED, citable=True)
    assert verification_differences(served, served) == []
    folded = supervisor_pb2.Verification()
    folded.CopyFrom(served)
    folded.findings[0].judgement = supervisor_pb2.CLAIM_JUDGEMENT_UNVERIFIED
    folded.supported_claims = 0
    folded.objections.add(objection_sequence_no=9)
    assert verification_differences(served, folded) == [
        'findings[0]: served {"findingSequenceNo": "3", "judgement": "CLAIM_JUDGEMENT_SUPPORTED", "citable": true}; '
        'the ledger gives {"findingSequenceNo": "3", "judgement": "CLAIM_JUDGEMENT_UNVERIFIED", "citable": true}',
        'objections[0]: served null; the ledger gives {"objectionSequenceNo": "9"}',
        "supported_claims: served 1; the ledger gives 0",
    ]
