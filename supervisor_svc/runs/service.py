"""Owns the runs of one supervisor process: starts, cancels, decides and streams them; runs are a tenant of
the host (supervisor_svc.hosting).

Each run executes as an asyncio task here. Its row carries a lease (owner and
heartbeat): this process renews its runs' leases, picks up cancellations and
approval decisions taken by another replica, and takes up any run whose owner stopped renewing,
going on from what that owner recorded, so a crashed supervisor neither loses a run nor leaves
it "running" with streams waiting on it forever.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from quarry import ids, paging
from quarry.api_auth import current_principal_name
from quarry.errors import (
    ErrorReason,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from quarry.notify import CommitSignal
from quarry.replay.qrun import first_time, recording_lines
from quarry.vocabulary import Entry
from supervisor_svc.hosting.host import Host, HostLimits, Tenant
from supervisor_svc.hosting.store import StoredEvent
from supervisor_svc.runs.domain import (
    Approval,
    ApprovalDecision,
    RunRecord,
    RunState,
    StartRequest,
    validate_start,
)
from supervisor_svc.runs.publishing import RunEventLog
from supervisor_svc.runs.run import ResearchRun, RunDependencies
from supervisor_svc.runs.store import RunStore

log = logging.getLogger(__name__)

# Bounds on what CancelRun, ApproveRun and RejectRun keep with the run.
_MAX_NOTE_CHARS = 1000
# ListRunLedger's page size: by default, and at most.
_LEDGER_PAGE = 100
_MAX_LEDGER_PAGE = 1000


def _refuse_over_open_objections(record: RunRecord) -> None:
    """A plain approval of a run whose review left objections open is refused, naming each one."""
    verification = record.verification
    if record.state is not RunState.AWAITING_APPROVAL or verification is None or not verification.open_objections:
        return
    still_open = verification.open_objections
    texts = {sentence.sentence_index: sentence.text for sentence in verification.sentences}
    listed = "; ".join(
        f"objection {o.objection_sequence_no} against sentence {o.sentence_index} "
        f"({texts.get(o.sentence_index, '')[:120]!r}): {o.reason[:200]}"
        for o in still_open
    )
    raise FailedPrecondition(
        f"run {record.run_id} has {len(still_open)} objection(s) its review left open: {listed}. Approving over "
        "them counts none of their sentences as supported: repeat with over_objections and a comment giving the "
        f"reason (quarry runs approve {record.run_id} --over-objections --comment REASON), or reject the run",
        reason=ErrorReason.OBJECTIONS_OPEN,
        metadata={"run_id": record.run_id, "objections": ",".join(str(o.objection_sequence_no) for o in still_open)},
    )


@dataclass(frozen=True)
class RunExport:
    record: RunRecord
    events: list[StoredEvent]
    # The supervisor's settings that shape a run's answers.
    settings: dict[str, Any]
    # The run's recorded exchanges and their bodies, the supervisor's and each worker's, as .qrun lines.
    recording: AsyncIterator[bytes]


class Supervisor:
    def __init__(
        self,
        store: RunStore,
        deps: RunDependencies,
        limits: HostLimits,
        signal: CommitSignal | None = None,
        *,
        allow_self_approval: bool = False,
    ) -> None:
        self._store = store
        # A run that waited out a database outage goes on only while this process still holds it.
        self._deps = replace(deps, reclaim=lambda run_id: store.reclaim(run_id, self._host.owner))
        self._allow_self_approval = allow_self_approval
        tenant = Tenant(
            kind="run",
            owner_prefix="supervisor",
            start_method="StartRun",
            at_capacity=lambda most: ResourceExhausted(
                f"this supervisor already runs {most} research runs; retry later", reason=ErrorReason.TOO_MANY_RUNS
            ),
            take_over=self._take_over,
            renewed=self._renewed,
            taken_over="taken up again here",
        )
        self._host: Host[ResearchRun, RunRecord] = Host(tenant, store, limits, signal)

    async def start(self) -> None:
        self._host.start()

    # -- the public operations ---------------------------------------------------------------

    async def start_run(self, request: StartRequest) -> RunRecord:
        validate_start(request)
        created_by = current_principal_name()
        return await self._host.start_work(
            request.request_id, request, lambda: self._create_and_launch(request, created_by)
        )

    async def _create_and_launch(self, request: StartRequest, created_by: str) -> RunRecord:
        run_id = ids.new_run_id()
        owner = self._host.owner
        record, created = await self._store.create(
            run_id, request, scratchpad_thread_id=run_id, owner=owner, created_by=created_by
        )
        if created:
            research = ResearchRun(record, RunEventLog(self._store, self._host.bus, run_id), self._deps)
            self._host.launch(run_id, research, research.execute())
        return record

    async def get(self, run_id: str) -> RunRecord:
        ids.RUN_ID.require("run_id", run_id)
        record = await self._store.get(run_id)
        if record is None:
            raise NotFound("run", run_id, field="run_id")
        return record

    async def export(self, run_id: str) -> RunExport:
        """Everything needed to replay an ended run: its record, its events, and what it recorded."""
        record = await self.get(run_id)
        if not record.state.ended:
            raise FailedPrecondition(f"run {run_id} is {record.state.value}: a run is exported once it has ended")
        events = [stored async for stored in await self.events(run_id, 0)]
        recordings = self._deps.recordings
        settings = dict(recordings.settings) if recordings is not None else {}
        return RunExport(record, events, settings, self._recording_lines(run_id))

    async def _recording_lines(self, run_id: str) -> AsyncIterator[bytes]:
        seen: set[bytes] = set()
        if self._deps.recordings is not None:
            exchanges, bodies = await self._deps.recordings.store.read(run_id)
            for text in recording_lines(exchanges, bodies):
                if first_time(seen, text):
                    yield text
        async for text in self._deps.delegations.recordings(run_id):
            if first_time(seen, text):
                yield text

    async def ledger(self, run_id: str, page_size: int, page_token: str) -> tuple[list[Entry], str]:
        """A page of the run's research ledger (its scratchpad thread) in sequence order, and the token of
        the next one ("" once the page reaches the end of what is written)."""
        violations = ids.violations(ids.RUN_ID.check("run_id", run_id))
        if page_size < 0:
            violations.append(FieldViolation("page_size", "must not be negative"))
        after = 0
        if page_token:
            cursor = paging.decode_token(page_token)
            run, _, number = (cursor or "").rpartition(":")
            if run != run_id or not number.isdecimal():
                violations.append(FieldViolation("page_token", "not a token from a ListRunLedger of this run"))
            else:
                after = int(number)
        if violations:
            raise InvalidArgument(violations)
        record = await self.get(run_id)
        limit = min(page_size or _LEDGER_PAGE, _MAX_LEDGER_PAGE)
        entries = await self._deps.scratchpad.read_all(record.scratchpad_thread_id, after_sequence_no=after)
        page = entries[:limit]
        more = len(entries) > limit
        return page, paging.encode_token(f"{run_id}:{page[-1].sequence_no}") if more else ""

    async def list_runs(self, page_size: int, page_token: str, state: RunState | None) -> tuple[list[RunRecord], str]:
        return await self._store.list_runs(page_size, page_token, state)

    async def cancel(self, run_id: str, reason: str) -> RunRecord:
        violations = ids.violations(ids.RUN_ID.check("run_id", run_id))
        if "\x00" in reason:  # it is stored with the run, and PostgreSQL text cannot hold NUL
            violations.append(FieldViolation("reason", "must not contain NUL characters"))
        if violations:
            raise InvalidArgument(violations)
        record = await self.get(run_id)
        if record.state.ended:
            return record
        reason = reason.strip()[:_MAX_NOTE_CHARS] or "cancelled by the client"
        within = self._host.limits.stop_wait_seconds
        if not await self._host.stop(run_id, lambda research: research.stopping(reason, end_within=within)):
            # Another replica runs it: it sees the request on its next heartbeat.
            await self._store.request_cancel(run_id, reason)
            await self._wait_ended(run_id)
        return await self.get(run_id)

    async def approve(self, run_id: str, comment: str, *, over_objections: bool = False) -> RunRecord:
        """Complete a run awaiting approval with its report; the comment goes on its ledger as a note. Objections
        the review left open refuse it, unless `over_objections` (and a comment giving the reason)."""
        return await self._decide(
            run_id, ApprovalDecision.APPROVED, comment, "comment", over_objections=over_objections
        )

    async def reject(self, run_id: str, reason: str) -> RunRecord:
        """Fail a run awaiting approval with REJECTED and the reason."""
        return await self._decide(run_id, ApprovalDecision.REJECTED, reason, "reason")

    async def _decide(
        self, run_id: str, decision: ApprovalDecision, note: str, note_field: str, *, over_objections: bool = False
    ) -> RunRecord:
        violations = ids.violations(ids.RUN_ID.check("run_id", run_id))
        if "\x00" in note:  # it is stored with the run, and PostgreSQL text cannot hold NUL
            violations.append(FieldViolation(note_field, "must not contain NUL characters"))
        if len(note) > _MAX_NOTE_CHARS:
            violations.append(FieldViolation(note_field, f"at most {_MAX_NOTE_CHARS} characters"))
        if over_objections and not note.strip():
            violations.append(FieldViolation(note_field, "approving over open objections needs the reason, here"))
        if violations:
            raise InvalidArgument(violations)
        note = note.strip()
        if decision is ApprovalDecision.REJECTED:
            note = note or "rejected by the client"
        record = await self.get(run_id)
        if decision is ApprovalDecision.APPROVED and not over_objections and record.approval is None:
            _refuse_over_open_objections(record)
        decided_by = current_principal_name()
        if (
            decision is ApprovalDecision.APPROVED
            and not self._allow_self_approval
            and record.created_by
            and record.created_by == decided_by
        ):
            # Rejecting one's own run is harmless; approving it would skip the second pair of eyes.
            raise PermissionDenied(
                f"{decided_by} started run {run_id} and may not approve it too; another approver must "
                "(or the supervisor must allow it: QUARRY_SUPERVISOR_ALLOW_SELF_APPROVAL)",
                reason=ErrorReason.SELF_APPROVAL_NOT_ALLOWED,
                metadata={"principal": decided_by, "run_id": run_id},
            )
        approval = Approval(decision, note, decided_by)
        if record.approval is None and record.state is RunState.AWAITING_APPROVAL:
            if await self._store.decide(run_id, approval):
                running = self._host.get(run_id)
                if running is not None:
                    running.work.decide(approval)
                # else another replica runs it: it sees the decision on its next lease renewal
            record = await self.get(run_id)  # decided meanwhile, by this call or a concurrent one
        if record.approval is None or record.approval.decision is not decision:
            raise FailedPrecondition(
                f"run {run_id} is {record.state.value}, not awaiting approval"
                if record.approval is None
                else f"run {run_id} was already {record.approval.decision.value}"
            )
        # This decision was taken (by this call, or by an earlier one that this call repeats).
        await self._wait_ended(run_id)
        return await self.get(run_id)

    async def _wait_ended(self, run_id: str) -> None:
        deadline = asyncio.get_running_loop().time() + self._host.limits.stop_wait_seconds
        while asyncio.get_running_loop().time() < deadline:
            record = await self._store.get(run_id)
            if record is None or record.state.ended:
                return
            await asyncio.sleep(0.2)

    async def events(self, run_id: str, after_sequence_no: int) -> AsyncIterator[StoredEvent]:
        """Events after `after_sequence_no`, in order, until the terminal one; waits for new ones.

        They come as stored: serialized RunEvents, which the servicer sends as they are."""
        ids.RUN_ID.require("run_id", run_id)
        return await self._host.events(run_id, after_sequence_no, self.get)

    # -- leases --------------------------------------------------------------------------------

    async def _renewed(self, run_ids: Sequence[str]) -> None:
        """Cancellations and approval decisions another replica took on runs here reach them now."""
        owner = self._host.owner
        for run_id, reason in await self._store.cancel_requests(owner, run_ids):
            self._host.cancel(run_id, functools.partial(ResearchRun.stopping, reason=reason))
        for run_id, approval in await self._store.decisions(owner, run_ids):
            running = self._host.get(run_id)
            if running is not None:
                running.work.decide(approval)

    async def _take_over(self, run_id: str) -> bool:
        """Go on with a run whose supervisor stopped renewing its lease, from what that one recorded: its
        conversation, its ledger and its events (supervisor_svc.runs.resumption). False when there is no
        room here, or another replica took it first."""
        if not self._host.has_room():
            return False
        stale_before = datetime.now(UTC) - timedelta(seconds=self._host.limits.lease_seconds)
        if not await self._store.take_over(run_id, self._host.owner, stale_before):
            return False
        record = await self._store.get(run_id)
        if record is None or record.state.ended:
            return False
        research = ResearchRun(record, RunEventLog(self._store, self._host.bus, run_id), self._deps)
        # A run still queued had recorded nothing: it starts as new.
        self._host.launch(run_id, research, research.execute(resumed=record.state is not RunState.QUEUED))
        return True

    async def close(self, end_within: float) -> None:
        """Stop every run here without ending it, and give up their leases: another replica, or this
        supervisor restarted, takes them up at once from what they recorded. A run already ending records
        its end within `end_within` seconds. The streams end."""
        held = await self._host.close(ResearchRun.releasing, end_within)
        if held:
            await self._store.release(self._host.owner, held)
