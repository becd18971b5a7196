"""How objections are closed on the run's ledger: one ObjectionResolution each, and a person's approval.

Each resolution is appended through the run's own RunLedger, with a request id made of the run and the
objection, so a retried append writes nothing twice.
"""

from __future__ import annotations

from dataclasses import replace

from quarry.records.research import ObjectionResolution, Resolution
from quarry.records.verification import ObjectionStatus, SentenceStatus, Verification
from supervisor_svc.runs.ledger import RunLedger

# The most of a reason (or of a sentence, in its resolution) one record or prompt carries.
MAX_REASON_CHARS = 4000


async def record_resolution(ledger: RunLedger, resolution: ObjectionResolution) -> int:
    """Append a resolution to the run's ledger; its entry's number, or 0 when the scratchpad would not take it
    (the run goes on: the report does not wait on a scratchpad hiccup)."""
    objection = resolution.objection_ref
    return await ledger.record(
        lambda: resolution, f"resolution/{objection}", f"the resolution of objection {objection}"
    )


async def approve_open_objections(
    verification: Verification, comment: str, approver: str, ledger: RunLedger
) -> Verification:
    """A person approved the run over the objections still open (ApproveRun with over_objections): each is
    resolved on the ledger as approved over, by whom and why, and its sentence stays in the report as written,
    APPROVED_OVER_OBJECTION: the review never stood behind it, and the run does not say it did."""
    still_open = verification.open_objections
    if not still_open:
        return verification
    texts = {sentence.sentence_index: sentence.text for sentence in verification.sentences}
    reason = f"approved over the objection by {approver or 'a person'}: {comment.strip() or 'no reason given'}"
    settled = {}
    for objection in still_open:
        record = ObjectionResolution(
            objection_ref=objection.objection_sequence_no,
            resolution=Resolution.APPROVED_BY_PERSON,
            sentence_index=objection.sentence_index,
            sentence=texts.get(objection.sentence_index, f"sentence {objection.sentence_index}")[:MAX_REASON_CHARS],
            reason=reason[:MAX_REASON_CHARS],
        )
        settled[objection.objection_sequence_no] = replace(
            objection,
            status=ObjectionStatus.APPROVED_BY_PERSON,
            resolution_sequence_no=await record_resolution(ledger, record),
        )
    approved_over = {objection.sentence_index for objection in still_open}
    return replace(
        verification,
        objections=tuple(settled.get(o.objection_sequence_no, o) for o in verification.objections),
        sentences=tuple(
            replace(s, status=SentenceStatus.APPROVED_OVER_OBJECTION)
            if s.sentence_index in approved_over and s.status is SentenceStatus.OBJECTED
            else s
            for s in verification.sentences
        ),
    )
