"""A person's approval closes the objections still open, through the run's own ledger, in milliseconds."""

from __future__ import annotations

from quarry.errors import Unavailable
from quarry.records.research import ObjectionResolution, Resolution
from quarry.records.verification import (
    ObjectionState,
    ObjectionStatus,
    SentenceCheck,
    SentenceStatus,
    Verification,
)
from quarry.vocabulary import EntryKind
from supervisor_svc.runs.ledger import RunLedger
from supervisor_svc.verification.resolutions import approve_open_objections
from tests.supervisor_svc.runs.test_delegating import RUN_ID, RecordingPlane

VERIFICATION = Verification(
    enabled=True,
    sentences=(
        SentenceCheck(1, "It opened in 1889 [1].", (2,), SentenceStatus.OBJECTED),
        SentenceCheck(2, "Some three hundred workers built it [2].", (3,), SentenceStatus.REVISED),
    ),
    objections=(
        ObjectionState(7, 1, "the finding gives no year"),
        ObjectionState(8, 2, "cites the wrong finding", ObjectionStatus.REVISED, resolution_sequence_no=9),
    ),
)


class RefusingPlane(RecordingPlane):
    async def append(self, thread_id: str, **fields: object) -> object:
        raise Unavailable("the scratchpad is away")


async def test_an_approval_over_open_objections_resolves_each_on_the_ledger_and_supports_none() -> None:
    plane = RecordingPlane()
    ledger = RunLedger(plane, RUN_ID, RUN_ID)  # type: ignore[arg-type]
    approved = await approve_open_objections(VERIFICATION, "  Checked the plaque myself. ", "alice", ledger)
    resolution = ObjectionResolution(
        objection_ref=7,
        resolution=Resolution.APPROVED_BY_PERSON,
        sentence_index=1,
        sentence="It opened in 1889 [1].",
        reason="approved over the objection by alice: Checked the plaque myself.",
    )
    # One entry, written as the run's supervisor under a request id that names the run and the objection.
    assert plane.appended == [(EntryKind.RESOLUTION, resolution, f"{RUN_ID}/resolution/7")]
    assert approved.objections == (
        ObjectionState(7, 1, "the finding gives no year", ObjectionStatus.APPROVED_BY_PERSON, resolution_sequence_no=1),
        VERIFICATION.objections[1],
    )
    # The sentence stays as written, never counted as supported.
    assert [s.status for s in approved.sentences] == [SentenceStatus.APPROVED_OVER_OBJECTION, SentenceStatus.REVISED]
    assert not approved.sentences[0].status.supported and approved.sentences[0].status.in_report
    assert await approve_open_objections(approved, "again", "alice", ledger) is approved  # nothing open: no entry
    assert len(plane.appended) == 1


async def test_an_approval_the_scratchpad_will_not_take_still_stands() -> None:
    ledger = RunLedger(RefusingPlane(), RUN_ID, RUN_ID)  # type: ignore[arg-type]
    approved = await approve_open_objections(VERIFICATION, "", "", ledger)
    assert approved.objections[0].status is ObjectionStatus.APPROVED_BY_PERSON
    assert approved.objections[0].resolution_sequence_no == 0  # unrecorded, logged
