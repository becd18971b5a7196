"""Owns the runs of one supervisor process: starts, cancels, streams and leases them.

Each run executes as an asyncio task here. Its row carries a lease (owner and
heartbeat): this process renews its runs' leases, picks up cancellations and
approval decisions taken by another replica, and ends as failed any run whose owner stopped renewing —
so a crashed supervisor never leaves a run "running" with streams waiting on it
forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from quarry import ids
from quarry.errors import (
    ErrorReason,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from quarry.lease import LeaseKeeper, LeaseTerms
from quarry.notify import CommitSignal
from supervisor_svc.following import Follower
from supervisor_svc.model import (
    Approval,
    ApprovalDecision,
    RunErrorCode,
    RunOutcome,
    RunRecord,
    RunState,
    StartRequest,
    validate_start,
)
from supervisor_svc.publishing import RunEventLog
from supervisor_svc.run import ResearchRun, RunDependencies
from supervisor_svc.store import RunEnded, RunStore, StoredEvent

log = logging.getLogger(__name__)

# How many other StartRuns with the same request_id (asking something else) one call waits out.
_MAX_START_WAITS = 8
# Bounds on what CancelRun, ApproveRun and RejectRun keep with the run.
_MAX_NOTE_CHARS = 1000


@dataclass(frozen=True)
class SupervisorLimits:
    max_active_runs: int = 32
    # A run whose owner has not renewed its lease for this long is ended as failed.
    lease_seconds: float = 30.0
    # Streams re-read this often without a local signal (events written by another replica).
    stream_poll_seconds: float = 1.0
    # How long CancelRun waits for the run to record its end (longer than a heartbeat interval).
    cancel_wait_seconds: float = 10.0


class _RunLeases:
    """The runs' lease store as the keeper sees it: renewing also picks up the cancellations and approval
    decisions taken by another replica, so they reach the run within one renewal interval."""

    def __init__(self, store: RunStore, runs: dict[str, tuple[ResearchRun, asyncio.Task[None]]]) -> None:
        self._store = store
        self._runs = runs

    async def renew(self, owner: str, ids: Sequence[str], now: datetime) -> None:
        await self._store.renew(owner, ids, now)
        for run_id, reason in await self._store.cancel_requests(owner, ids):
            running = self._runs.get(run_id)
            if running is not None and not running[1].done():
                _stop(running, reason)
        for run_id, approval in await self._store.decisions(owner, ids):
            running = self._runs.get(run_id)
            if running is not None:
                running[0].decide(approval)

    async def expired(self, stale_before: datetime) -> list[str]:
        return await self._store.expired(stale_before)


class Supervisor:
    def __init__(
        self, store: RunStore, deps: RunDependencies, limits: SupervisorLimits, signal: CommitSignal | None = None
    ) -> None:
        self._store = store
        self._deps = deps
        self._limits = limits
        self._bus = signal or CommitSignal()
        self._owner = f"supervisor-{uuid.uuid4().hex[:12]}"
        self._runs: dict[str, tuple[ResearchRun, asyncio.Task[None]]] = {}
        self._starting = 0
        # StartRuns under way by request_id (with the digest of what they ask): concurrent retries of one
        # request share its start, so they take one slot and get one run.
        self._starts: dict[str, tuple[str, asyncio.Future[RunRecord]]] = {}
        self._closing = asyncio.Event()
        self._follower = Follower(self._bus, self._closing, limits.stream_poll_seconds)
        # Renewals often enough that a CancelRun taken by another replica reaches the run within seconds.
        self._leases = LeaseKeeper(
            "run",
            self._owner,
            _RunLeases(store, self._runs),
            held=lambda: list(self._runs),
            take_over=self._end_as_failed,
            terms=LeaseTerms(limits.lease_seconds, max_interval_seconds=2.0),
        )

    async def start(self) -> None:
        self._leases.start()

    # -- the public operations ---------------------------------------------------------------

    async def start_run(self, request: StartRequest) -> RunRecord:
        validate_start(request)
        if not request.request_id:
            return await self._start(request)
        digest = request.digest()
        for _ in range(_MAX_START_WAITS):
            under_way = self._starts.get(request.request_id)
            if under_way is None or under_way[1].done():
                break
            known, start = under_way
            if known == digest:
                return await asyncio.shield(start)  # the same request, already being started: its outcome
            # Another request with this request_id is being started: once it has, the store says whose it is.
            await asyncio.wait([start])
        else:
            raise Unavailable(f"other StartRuns with request_id {request.request_id!r} keep arriving; retry")
        # A task of its own: a caller that goes away does not abandon a start its retries may be waiting on.
        start = asyncio.ensure_future(self._start(request))
        entry = (digest, start)
        self._starts[request.request_id] = entry
        start.add_done_callback(lambda _: self._start_ended(request.request_id, entry))
        return await asyncio.shield(start)

    def _start_ended(self, request_id: str, entry: tuple[str, asyncio.Future[RunRecord]]) -> None:
        if self._starts.get(request_id) is entry:
            del self._starts[request_id]
        if not entry[1].cancelled():
            entry[1].exception()  # retrieved, though every caller may have gone

    async def _start(self, request: StartRequest) -> RunRecord:
        if request.request_id:  # a retry gets its run back, whatever the load now
            existing = await self._store.by_request_id(request.request_id, request)
            if existing is not None:
                return existing
        if self._closing.is_set():
            raise Unavailable("the supervisor is shutting down; retry", reason=ErrorReason.SHUTTING_DOWN)
        if len(self._runs) + self._starting >= self._limits.max_active_runs:
            raise ResourceExhausted(
                f"this supervisor already runs {self._limits.max_active_runs} research runs; retry later",
                reason=ErrorReason.TOO_MANY_RUNS,
            )
        self._starting += 1  # holds the slot across the awaits, so concurrent calls cannot overshoot
        try:
            # Shielded: once the row exists, its task must too, even if the caller goes away meanwhile.
            return await asyncio.shield(self._create_and_launch(request))
        finally:
            self._starting -= 1

    async def _create_and_launch(self, request: StartRequest) -> RunRecord:
        run_id = ids.new_run_id()
        record, created = await self._store.create(run_id, request, scratchpad_thread_id=run_id, owner=self._owner)
        if created:
            research = ResearchRun(record, RunEventLog(self._store, self._bus, run_id), self._deps)
            task = asyncio.create_task(research.execute(), name=run_id)
            self._runs[run_id] = (research, task)
            task.add_done_callback(lambda _: self._runs.pop(run_id, None))
        return record

    async def get(self, run_id: str) -> RunRecord:
        ids.RUN_ID.require("run_id", run_id)
        record = await self._store.get(run_id)
        if record is None:
            raise NotFound("run", run_id, field="run_id")
        return record

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
        running = self._runs.get(run_id)
        if running is not None:
            _stop(running, reason, end_within=self._limits.cancel_wait_seconds)
            await asyncio.wait([running[1]], timeout=self._limits.cancel_wait_seconds)
        else:  # another replica runs it: it sees the request on its next heartbeat
            await self._store.request_cancel(run_id, reason)
            await self._wait_ended(run_id)
        return await self.get(run_id)

    async def approve(self, run_id: str, comment: str) -> RunRecord:
        """Complete a run awaiting approval with its report; the comment goes on its ledger as a note."""
        return await self._decide(run_id, ApprovalDecision.APPROVED, comment, "comment")

    async def reject(self, run_id: str, reason: str) -> RunRecord:
        """Fail a run awaiting approval with REJECTED and the reason."""
        return await self._decide(run_id, ApprovalDecision.REJECTED, reason, "reason")

    async def _decide(self, run_id: str, decision: ApprovalDecision, note: str, note_field: str) -> RunRecord:
        violations = ids.violations(ids.RUN_ID.check("run_id", run_id))
        if "\x00" in note:  # it is stored with the run, and PostgreSQL text cannot hold NUL
            violations.append(FieldViolation(note_field, "must not contain NUL characters"))
        if len(note) > _MAX_NOTE_CHARS:
            violations.append(FieldViolation(note_field, f"at most {_MAX_NOTE_CHARS} characters"))
        if violations:
            raise InvalidArgument(violations)
        note = note.strip()
        if decision is ApprovalDecision.REJECTED:
            note = note or "rejected by the client"
        record = await self.get(run_id)
        if record.approval is None and record.state is RunState.AWAITING_APPROVAL:
            if await self._store.decide(run_id, Approval(decision, note)):
                running = self._runs.get(run_id)
                if running is not None:
                    running[0].decide(Approval(decision, note))
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
        deadline = asyncio.get_running_loop().time() + self._limits.cancel_wait_seconds
        while asyncio.get_running_loop().time() < deadline:
            record = await self._store.get(run_id)
            if record is None or record.state.ended:
                return
            await asyncio.sleep(0.2)

    async def events(self, run_id: str, after_sequence_no: int) -> AsyncIterator[StoredEvent]:
        """Events after `after_sequence_no`, in order, until the terminal one; waits for new ones.

        They come as stored: serialized RunEvents, which the servicer sends as they are."""
        ids.RUN_ID.require("run_id", run_id)
        if after_sequence_no < 0:
            raise InvalidArgument([FieldViolation("after_sequence_no", "must not be negative")])
        record = await self.get(run_id)
        if after_sequence_no > record.last_sequence_no:
            raise InvalidArgument(
                [FieldViolation("after_sequence_no", f"the run's newest event is {record.last_sequence_no}")]
            )
        return self._follower.follow(self._store, run_id, after_sequence_no)

    # -- leases --------------------------------------------------------------------------------

    async def _end_as_failed(self, run_id: str) -> bool:
        record = await self._store.get(run_id)
        if record is None or record.state.ended:
            return False
        message = "the supervisor executing this run stopped before it ended"
        try:
            await self._store.finish(run_id, RunOutcome.failed(RunErrorCode.INTERNAL, message, record.usage))
        except RunEnded:  # another replica got there first
            return False
        finally:
            self._bus.publish(run_id)
        return True

    async def close(self, end_within: float) -> None:
        """Cancel every run and end the streams; each run records its cancelled end within `end_within`
        seconds, whatever the scratchpad does."""
        self._closing.set()
        for running in list(self._runs.values()):
            _stop(running, "the supervisor shut down", end_within=end_within)
        await asyncio.gather(*(task for _, task in self._runs.values()), return_exceptions=True)
        await self._leases.stop()


def _stop(running: tuple[ResearchRun, asyncio.Task[None]], reason: str, *, end_within: float | None = None) -> None:
    """Cancel a run; with `end_within`, it records its end within that many seconds."""
    research, task = running
    research.cancel_reason = reason
    if end_within is not None:
        research.end_by = time.monotonic() + end_within
    task.cancel()
