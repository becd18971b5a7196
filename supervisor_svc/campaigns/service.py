"""Owns the campaigns of one supervisor process: starts, pauses, resumes, stops, directs, streams and leases them.

Each live campaign (queued, running, sleeping) is driven by a `CampaignLoop` in an asyncio task of
the process that holds its lease. The loop itself is pluggable: `Campaigns` is given a factory, and
everything here (the state machine, durability, leases, streams) is the same whichever loop runs.
The loop gets a `CampaignHandle`, its only way to change the campaign: every write through it
checks, in its transaction, that this process still drives the campaign, and raises CampaignLost
otherwise.

A human's pause or stop changes the state in the database first, then cancels the loop's task if it
runs here; a replica that drives it notices at its next lease renewal (or write) and cancels its
own. A paused campaign has no loop; resuming it starts one where the campaign's phase says it was.
A campaign whose driver stopped renewing its lease is taken over by whichever replica sweeps first,
and its loop starts again there: so the loop must redo a half-finished step idempotently (a keyed
event is stored once; directives are consumed once; the monitor's jobs have request ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

from quarry import ids
from quarry.errors import (
    ErrorReason,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Unimplemented,
)
from quarry.lease import LeaseKeeper, LeaseTerms
from quarry.notify import CommitSignal
from supervisor_svc.campaigns import events
from supervisor_svc.campaigns.events import Event
from supervisor_svc.campaigns.records import LedgerRecord
from supervisor_svc.campaigns.spec import CampaignSpec, check_campaign_id, check_directive, reason_text, validate_spec
from supervisor_svc.campaigns.state import CampaignRecord, CampaignState, DirectiveRecord, Phase, Progress
from supervisor_svc.campaigns.store import CampaignLost, CampaignStore
from supervisor_svc.following import Follower
from supervisor_svc.store import StoredEvent

log = logging.getLogger(__name__)

_T = TypeVar("_T")

_LIVE = (CampaignState.QUEUED, CampaignState.RUNNING, CampaignState.SLEEPING)
# How many times a human's change is retried when the campaign changed state under it.
_TRANSITION_TRIES = 4


class CampaignHandle:
    """What a loop may do to the campaign it drives; each call raises CampaignLost once it no longer does."""

    def __init__(self, record: CampaignRecord, store: CampaignStore, owner: str, bus: CommitSignal) -> None:
        self.record = record  # as it was when the loop started
        self._store = store
        self._owner = owner
        self._bus = bus

    @property
    def campaign_id(self) -> str:
        return self.record.campaign_id

    async def current(self) -> CampaignRecord:
        """The campaign as stored now (its counters, pending directives, state)."""
        record = await self._store.get(self.campaign_id)
        if record is None:
            raise CampaignLost(self.campaign_id)
        return record

    async def set_phase(self, phase: Phase, cycle: int, message: str = "") -> None:
        await self._published(self._store.set_phase(self.campaign_id, self._owner, phase, cycle, message))

    async def emit(self, *batch: Event, key: str = "") -> bool:
        """Store events; with `key`, only the first time (False when they were stored before)."""
        return await self._published(self._store.append(self.campaign_id, self._owner, batch, key=key))

    async def record_usage(self, tokens: int) -> None:
        """Count tokens as they are used (the total and the last hour GetCampaign shows)."""
        await self._store.record_usage(self.campaign_id, self._owner, tokens)

    async def record_ledger(self, record: LedgerRecord, progress: Progress | None = None) -> bool:
        """The cycle's ledger row as an event, once per cycle (False when it was recorded before)."""
        write = self._store.record_ledger(self.campaign_id, self._owner, record, progress or Progress())
        return await self._published(write)

    async def sleep(self, until: datetime, reason: str) -> None:
        """Say the campaign waits for a budget until `until` (the loop does the waiting)."""
        await self._published(self._store.sleep(self.campaign_id, self._owner, until, reason))

    async def pending_directives(self) -> list[DirectiveRecord]:
        return await self._store.pending_directives(self.campaign_id)

    async def consume_directives(self, request_ids: Sequence[str], cycle: int) -> list[DirectiveRecord]:
        """Mark directives consumed by the THINK of `cycle`; each is returned by one call only, ever."""
        return await self._published(self._store.consume_directives(self.campaign_id, self._owner, request_ids, cycle))

    async def pause(self, reason: str) -> None:
        """Pause the campaign (a human must look); the loop then returns."""
        await self._published(self._store.pause_held(self.campaign_id, self._owner, reason))

    async def finish(self, state: CampaignState, reason: str) -> None:
        """End the campaign: COMPLETED (a budget spent, the phase gate) or FAILED; the loop then returns."""
        if state not in (CampaignState.COMPLETED, CampaignState.FAILED):
            raise ValueError(f"a loop ends a campaign as completed or failed, not {state}")
        await self._published(self._store.finish(self.campaign_id, self._owner, state, reason))

    async def _published(self, write: Awaitable[_T]) -> _T:
        try:
            return await write
        finally:
            self._bus.publish(self.campaign_id)


class CampaignLoop(Protocol):
    async def run(self) -> None:
        """Drive the campaign from where its record says it is until it ends (`handle.finish`) or pauses
        itself (`handle.pause`), then return. It is cancelled when a human pauses or stops the campaign or
        the process shuts down; CampaignLost from the handle means the same: stop. An exception fails the
        campaign."""


# Makes the loop for one campaign; called each time a campaign is started, resumed or taken over here.
CampaignLoopFactory = Callable[[CampaignHandle], CampaignLoop]


@dataclass(frozen=True)
class CampaignLimits:
    # Campaigns this process drives at once; beyond it StartCampaign answers RESOURCE_EXHAUSTED and
    # expired campaigns are left to other replicas.
    max_active_campaigns: int = 64
    # A campaign whose driver has not renewed its lease for this long is taken over.
    lease_seconds: float = 30.0
    # Streams re-read this often without a local signal (events written by another replica).
    stream_poll_seconds: float = 1.0
    # How long a pause or stop waits for the loop's task here to end.
    stop_wait_seconds: float = 10.0


class _CampaignLeases:
    """The lease store as the keeper sees it: renewing also stops the loops of campaigns that are no longer
    this process's (paused or stopped through another replica, or taken over after a late renewal)."""

    def __init__(self, store: CampaignStore, campaigns: Campaigns) -> None:
        self._store = store
        self._campaigns = campaigns

    async def renew(self, owner: str, campaign_ids: Sequence[str], now: datetime) -> None:
        await self._store.renew(owner, campaign_ids, now)
        still = await self._store.held(owner, campaign_ids)
        for campaign_id in set(campaign_ids) - still:
            self._campaigns.cancel_loop(campaign_id)

    async def expired(self, stale_before: datetime) -> list[str]:
        return await self._store.expired(stale_before)


class Campaigns:
    def __init__(
        self,
        store: CampaignStore,
        loop: CampaignLoopFactory | None,
        limits: CampaignLimits,
        signal: CommitSignal | None = None,
    ) -> None:
        self._store = store
        self._loop = loop
        self._limits = limits
        self._bus = signal or CommitSignal()
        self.owner = f"campaigns-{uuid.uuid4().hex[:12]}"
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._starting = 0
        self._closing = asyncio.Event()
        self._follower = Follower(self._bus, self._closing, limits.stream_poll_seconds)
        self._leases = LeaseKeeper(
            "campaign",
            self.owner,
            _CampaignLeases(store, self),
            held=lambda: list(self._tasks),
            take_over=self._take_over,
            terms=LeaseTerms(limits.lease_seconds, max_interval_seconds=2.0),
            taken_over="resumed here",
        )

    async def start(self) -> None:
        """Renew leases and take over expired campaigns from now on."""
        self._leases.start()

    # -- the public operations -----------------------------------------------------------------------

    async def start_campaign(self, spec: CampaignSpec, request_id: str) -> CampaignRecord:
        if request_id:
            ids.REQUEST_ID.require("request_id", request_id)
        spec = validate_spec(spec, datetime.now(UTC))
        if request_id:  # a retry gets its campaign back, whatever the load now
            existing = await self._store.by_request_id(request_id, spec)
            if existing is not None:
                return existing
        if self._loop is None:
            message = "this supervisor cannot run campaigns: it has no campaign loop"
            raise Unimplemented(message, reason=ErrorReason.CAMPAIGN_LOOP_MISSING)
        if self._closing.is_set():
            raise Unavailable("the supervisor is shutting down; retry", reason=ErrorReason.SHUTTING_DOWN)
        if len(self._tasks) + self._starting >= self._limits.max_active_campaigns:
            raise ResourceExhausted(
                f"this supervisor already drives {self._limits.max_active_campaigns} campaigns; retry later",
                reason=ErrorReason.TOO_MANY_CAMPAIGNS,
            )
        self._starting += 1  # holds the slot across the awaits, so concurrent calls cannot overshoot
        try:
            # Shielded: once the row exists, its loop must run, even if the caller goes away meanwhile.
            return await asyncio.shield(self._create_and_launch(spec, request_id))
        finally:
            self._starting -= 1

    async def _create_and_launch(self, spec: CampaignSpec, request_id: str) -> CampaignRecord:
        record, created = await self._store.create(ids.new_campaign_id(), spec, request_id, self.owner)
        if created:
            self._launch(record)
        return record

    async def get(self, campaign_id: str) -> CampaignRecord:
        check_campaign_id(campaign_id)
        record = await self._store.get(campaign_id)
        if record is None:
            raise NotFound("campaign", campaign_id, field="campaign_id")
        return record

    async def list_campaigns(
        self, page_size: int, page_token: str, state: CampaignState | None
    ) -> tuple[list[CampaignRecord], str]:
        return await self._store.list_campaigns(page_size, page_token, state)

    async def pause(self, campaign_id: str, reason: str) -> CampaignRecord:
        """Pause a live campaign; a no-op on a paused one, FAILED_PRECONDITION on an ended one."""
        check_campaign_id(campaign_id)
        reason = reason_text(reason, "paused by a human")
        columns = {"pause_reason": reason, "sleep_until": None, "sleep_reason": ""}
        for _ in range(_TRANSITION_TRIES):
            if await self._transition(campaign_id, _LIVE, CampaignState.PAUSED, events.paused(reason), columns):
                await self._stop_loop(campaign_id)
                break
            record = await self.get(campaign_id)
            if record.state.ended:
                raise _ended(record, "paused")
            if record.state is CampaignState.PAUSED:
                return record
        return await self.get(campaign_id)

    async def resume(self, campaign_id: str, reason: str) -> CampaignRecord:
        """Resume a paused campaign where it was; a no-op on a live one, FAILED_PRECONDITION on an ended one."""
        check_campaign_id(campaign_id)
        reason = reason_text(reason, "resumed by a human")
        for _ in range(_TRANSITION_TRIES):
            now = datetime.now(UTC)
            # Held here from the start, so no other replica's sweep takes it over before it is launched.
            columns = {"pause_reason": "", "resume_time": now, "owner": self.owner, "heartbeat_time": now}
            resumed = events.resumed(reason)
            if await self._transition(campaign_id, (CampaignState.PAUSED,), CampaignState.QUEUED, resumed, columns):
                record = await self.get(campaign_id)
                if self._can_drive():
                    self._launch(record)
                else:  # left to a replica that can
                    await self._store.release(self.owner, [campaign_id])
                return record
            record = await self.get(campaign_id)
            if record.state.ended:
                raise _ended(record, "resumed")
            if record.state.live:
                return record
        return await self.get(campaign_id)

    async def stop(self, campaign_id: str, reason: str) -> CampaignRecord:
        """End a campaign for good (STOPPED); a no-op on an ended one."""
        check_campaign_id(campaign_id)
        reason = reason_text(reason, "stopped by a human")
        columns = {"end_reason": reason, "sleep_until": None, "sleep_reason": "", "pause_reason": ""}
        ongoing = (*_LIVE, CampaignState.PAUSED)
        ending = events.ended(CampaignState.STOPPED, reason)
        if await self._transition(campaign_id, ongoing, CampaignState.STOPPED, ending, columns):
            await self._stop_loop(campaign_id)
        return await self.get(campaign_id)

    async def send_directive(self, campaign_id: str, text: str, request_id: str) -> DirectiveRecord:
        """A directive for the next THINK; idempotent by request_id; FAILED_PRECONDITION once the campaign ended."""
        violations = ids.violations(ids.CAMPAIGN_ID.check("campaign_id", campaign_id))
        if violations:
            raise InvalidArgument(violations)
        check_directive(text, request_id)
        try:
            added = await self._store.add_directive(campaign_id, request_id or str(uuid.uuid4()), text)
        finally:
            self._bus.publish(campaign_id)
        if added is None:  # the campaign has ended, or does not exist (NOT_FOUND from get)
            raise _ended(await self.get(campaign_id), "directed")
        return added[0]

    async def events(self, campaign_id: str, after_sequence_no: int) -> AsyncIterator[StoredEvent]:
        """Events after `after_sequence_no`, in order, until the ended one; waits for new ones."""
        check_campaign_id(campaign_id)
        if after_sequence_no < 0:
            raise InvalidArgument([FieldViolation("after_sequence_no", "must not be negative")])
        record = await self.get(campaign_id)
        if after_sequence_no > record.last_sequence_no:
            raise InvalidArgument(
                [FieldViolation("after_sequence_no", f"the campaign's newest event is {record.last_sequence_no}")]
            )
        return self._follower.follow(self._store, campaign_id, after_sequence_no)

    # -- state changes ---------------------------------------------------------------------------------

    async def _transition(
        self,
        campaign_id: str,
        from_states: Sequence[CampaignState],
        to: CampaignState,
        event: Event,
        columns: dict[str, Any],
    ) -> bool:
        try:
            return await self._store.transition(campaign_id, from_states, to, event, columns)
        finally:
            self._bus.publish(campaign_id)

    # -- the loops -------------------------------------------------------------------------------------

    def _can_drive(self) -> bool:
        capacity = len(self._tasks) + self._starting < self._limits.max_active_campaigns
        return self._loop is not None and capacity and not self._closing.is_set()

    def _launch(self, record: CampaignRecord) -> None:
        assert self._loop is not None
        campaign_id = record.campaign_id
        handle = CampaignHandle(record, self._store, self.owner, self._bus)
        task = asyncio.create_task(self._drive(handle, self._loop(handle)), name=campaign_id)
        self._tasks[campaign_id] = task
        task.add_done_callback(lambda done: self._ended(campaign_id, done))

    def _ended(self, campaign_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(campaign_id) is task:
            del self._tasks[campaign_id]

    async def _drive(self, handle: CampaignHandle, loop: CampaignLoop) -> None:
        campaign_id = handle.campaign_id
        try:
            await loop.run()
        except CampaignLost:
            return  # paused, stopped or taken over meanwhile: nothing more to do here
        except Exception as error:
            log.exception("campaign %s: the loop failed", campaign_id)
            await self._fail(handle, f"the campaign loop failed: {type(error).__name__}: {error}")
            return
        # Still live and held here: the loop gave up without saying how the campaign ends (a no-op otherwise).
        await self._fail(handle, "the campaign loop returned without ending or pausing the campaign")

    async def _fail(self, handle: CampaignHandle, reason: str) -> None:
        with contextlib.suppress(CampaignLost):  # no longer this process's to end
            await handle.finish(CampaignState.FAILED, reason)

    def cancel_loop(self, campaign_id: str) -> None:
        """Stop the loop of a campaign this process no longer drives."""
        task = self._tasks.get(campaign_id)
        if task is not None:
            task.cancel()

    async def _stop_loop(self, campaign_id: str) -> None:
        task = self._tasks.get(campaign_id)
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=self._limits.stop_wait_seconds)

    async def _take_over(self, campaign_id: str) -> bool:
        if not self._can_drive():
            return False
        stale_before = datetime.now(UTC) - timedelta(seconds=self._limits.lease_seconds)
        record = await self._store.take_over(campaign_id, self.owner, stale_before)
        if record is None:
            return False
        self._launch(record)
        return True

    async def close(self, end_within: float) -> None:
        """Stop every loop here and give up their leases, so another replica (or this one, restarted) takes
        the campaigns over at once; end the streams."""
        self._closing.set()
        held = list(self._tasks)
        for task in list(self._tasks.values()):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=end_within)
        await self._leases.stop()
        if held:
            await self._store.release(self.owner, held)


def _ended(record: CampaignRecord, verb: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"campaign {record.campaign_id} has {record.state.value}; it cannot be {verb}",
        reason=ErrorReason.CAMPAIGN_ENDED,
        metadata={"campaign_id": record.campaign_id, "state": record.state.value},
    )
