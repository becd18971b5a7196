"""Owns the campaigns of one supervisor process: starts, pauses, resumes, stops, directs and streams them;
campaigns are a tenant of the host (supervisor_svc.hosting), as runs are.

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

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from quarry import ids
from quarry.api_auth import current_principal_name
from quarry.errors import (
    DatabaseUnavailable,
    ErrorReason,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unimplemented,
)
from quarry.notify import CommitSignal
from quarry.records.campaign import TrialRecord
from supervisor_svc.campaigns import events
from supervisor_svc.campaigns.events import Event
from supervisor_svc.campaigns.preflight import Preflight
from supervisor_svc.campaigns.spec import CampaignSpec, check_campaign_id, check_directive, reason_text, validate_spec
from supervisor_svc.campaigns.state import CampaignRecord, CampaignState, DirectiveRecord, Phase, Progress
from supervisor_svc.campaigns.store import CampaignLost, CampaignStore
from supervisor_svc.hosting.following import EventLogWriter
from supervisor_svc.hosting.host import Host, HostLimits, Tenant
from supervisor_svc.hosting.store import StoredEvent

log = logging.getLogger(__name__)

_LIVE = (CampaignState.QUEUED, CampaignState.RUNNING, CampaignState.SLEEPING)
# How many times a human's change is retried when the campaign changed state under it.
_TRANSITION_TRIES = 4
# Campaigns one process drives at once, unless told otherwise.
MAX_ACTIVE_CAMPAIGNS = 64


class CampaignHandle:
    """What a loop may do to the campaign it drives; each call raises CampaignLost once it no longer does."""

    def __init__(self, record: CampaignRecord, store: CampaignStore, owner: str, bus: CommitSignal) -> None:
        self.record = record  # as it was when the loop started
        self._store = store
        self._owner = owner
        self._log = EventLogWriter(bus, record.campaign_id)

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
        await self._log.write(lambda: self._store.set_phase(self.campaign_id, self._owner, phase, cycle, message))

    async def emit(self, *batch: Event, key: str = "") -> bool:
        """Store events; with `key`, only the first time (False when they were stored before)."""
        return await self._log.write(lambda: self._store.append(self.campaign_id, self._owner, batch, key=key))

    async def record_usage(self, tokens: int) -> None:
        """Count tokens as they are used (the total and the last hour GetCampaign shows)."""
        await self._store.record_usage(self.campaign_id, self._owner, tokens)

    async def record_trial(self, record: TrialRecord, progress: Progress | None = None) -> bool:
        """The cycle's ledger row as an event, once per cycle (False when it was recorded before)."""
        progress = progress or Progress()
        return await self._log.write(lambda: self._store.record_trial(self.campaign_id, self._owner, record, progress))

    async def sleep(self, until: datetime, reason: str) -> None:
        """Say the campaign waits for a budget until `until` (the loop does the waiting)."""
        await self._log.write(lambda: self._store.sleep(self.campaign_id, self._owner, until, reason))

    async def pending_directives(self) -> list[DirectiveRecord]:
        return await self._store.pending_directives(self.campaign_id)

    async def consume_directives(self, request_ids: Sequence[str], cycle: int) -> list[DirectiveRecord]:
        """Mark directives consumed by the THINK of `cycle`; each is returned by one call only, ever."""
        return await self._log.write(
            lambda: self._store.consume_directives(self.campaign_id, self._owner, request_ids, cycle)
        )

    async def pause(self, reason: str) -> None:
        """Pause the campaign (a human must look); the loop then returns."""
        await self._log.write(lambda: self._store.pause_held(self.campaign_id, self._owner, reason))

    async def finish(self, state: CampaignState, reason: str) -> None:
        """End the campaign: COMPLETED (a budget spent, the phase gate) or FAILED; the loop then returns."""
        if state not in (CampaignState.COMPLETED, CampaignState.FAILED):
            raise ValueError(f"a loop ends a campaign as completed or failed, not {state}")
        await self._log.write(lambda: self._store.finish(self.campaign_id, self._owner, state, reason))


class CampaignLoop(Protocol):
    async def run(self) -> None:
        """Drive the campaign from where its record says it is until it ends (`handle.finish`) or pauses
        itself (`handle.pause`), then return. It is cancelled when a human pauses or stops the campaign or
        the process shuts down; CampaignLost from the handle means the same: stop. An exception fails the
        campaign."""


# Makes the loop for one campaign; called each time a campaign is started, resumed or taken over here.
CampaignLoopFactory = Callable[[CampaignHandle], CampaignLoop]


class Campaigns:
    def __init__(
        self,
        store: CampaignStore,
        loop: CampaignLoopFactory | None,
        limits: HostLimits,
        signal: CommitSignal | None = None,
        preflight: Preflight | None = None,
    ) -> None:
        self._store = store
        self._loop = loop
        # Asks the monitor whether a campaign can run before it is accepted; None: nothing to ask.
        self._preflight = preflight
        tenant = Tenant(
            kind="campaign",
            owner_prefix="campaigns",
            start_method="StartCampaign",
            at_capacity=lambda most: ResourceExhausted(
                f"this supervisor already drives {most} campaigns; retry later", reason=ErrorReason.TOO_MANY_CAMPAIGNS
            ),
            take_over=self._take_over,
            renewed=self._renewed,
            taken_over="resumed here",
        )
        self._host: Host[CampaignHandle, CampaignRecord] = Host(tenant, store, limits, signal)
        self._bus = self._host.bus
        self.owner = self._host.owner

    async def start(self) -> None:
        """Renew leases and take over expired campaigns from now on."""
        self._host.start()

    # -- the public operations -----------------------------------------------------------------------

    async def start_campaign(self, spec: CampaignSpec, request_id: str) -> CampaignRecord:
        if request_id:
            ids.REQUEST_ID.require("request_id", request_id)
        spec = validate_spec(spec, datetime.now(UTC))
        self._check_loop()
        if self._preflight is not None:
            await self._preflight(spec)
        created_by = current_principal_name()
        return await self._host.start_work(
            request_id, spec, lambda: self._create_and_launch(spec, request_id, created_by), ready=self._check_loop
        )

    def _check_loop(self) -> None:
        if self._loop is None:
            message = "this supervisor cannot run campaigns: it has no campaign loop"
            raise Unimplemented(message, reason=ErrorReason.CAMPAIGN_LOOP_MISSING)

    async def _create_and_launch(self, spec: CampaignSpec, request_id: str, created_by: str) -> CampaignRecord:
        record, created = await self._store.create(ids.new_campaign_id(), spec, request_id, self.owner, created_by)
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
            added = await self._store.add_directive(
                campaign_id, request_id or str(uuid.uuid4()), text, current_principal_name()
            )
        finally:
            self._bus.publish(campaign_id)
        if added is None:  # the campaign has ended, or does not exist (NOT_FOUND from get)
            raise _ended(await self.get(campaign_id), "directed")
        return added[0]

    async def events(self, campaign_id: str, after_sequence_no: int) -> AsyncIterator[StoredEvent]:
        """Events after `after_sequence_no`, in order, until the ended one; waits for new ones."""
        check_campaign_id(campaign_id)
        return await self._host.events(campaign_id, after_sequence_no, self.get)

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
        return self._loop is not None and self._host.has_room()

    def _launch(self, record: CampaignRecord) -> None:
        assert self._loop is not None
        handle = CampaignHandle(record, self._store, self.owner, self._bus)
        self._host.launch(record.campaign_id, handle, self._drive(handle, self._loop(handle)))

    async def _drive(self, handle: CampaignHandle, loop: CampaignLoop) -> None:
        campaign_id = handle.campaign_id
        try:
            await loop.run()
        except CampaignLost:
            return  # paused, stopped or taken over meanwhile: nothing more to do here
        except DatabaseUnavailable as error:
            # Its state is durable: left unrenewed, its lease lapses and, once the database answers again, the
            # next sweep (of any replica, this one too) resumes it from what it recorded.
            log.warning("campaign %s: its database is unreachable (%s); it resumes once it answers", campaign_id, error)
            return
        except Exception as error:
            log.exception("campaign %s: the loop failed", campaign_id)
            await self._fail(handle, f"the campaign loop failed: {type(error).__name__}: {error}")
            return
        # Still live and held here: the loop gave up without saying how the campaign ends (a no-op otherwise).
        await self._fail(handle, "the campaign loop returned without ending or pausing the campaign")

    async def _fail(self, handle: CampaignHandle, reason: str) -> None:
        with contextlib.suppress(CampaignLost):  # no longer this process's to end
            await handle.finish(CampaignState.FAILED, reason)

    async def _renewed(self, campaign_ids: Sequence[str]) -> None:
        """Stop the loops of campaigns that are no longer this process's (paused or stopped through another
        replica, or taken over after a late renewal)."""
        still = await self._store.held(self.owner, campaign_ids)
        for campaign_id in set(campaign_ids) - still:
            self._host.cancel(campaign_id)

    async def _stop_loop(self, campaign_id: str) -> None:
        await self._host.stop(campaign_id)

    async def _take_over(self, campaign_id: str) -> bool:
        if not self._can_drive():
            return False
        stale_before = datetime.now(UTC) - timedelta(seconds=self._host.limits.lease_seconds)
        record = await self._store.take_over_record(campaign_id, self.owner, stale_before)
        if record is None:
            return False
        self._launch(record)
        return True

    async def close(self, end_within: float) -> None:
        """Stop every loop here and give up their leases, so another replica (or this one, restarted) takes
        the campaigns over at once; end the streams."""
        held = await self._host.close(lambda handle: None, end_within)
        if held:
            await self._store.release(self.owner, held)


def _ended(record: CampaignRecord, verb: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"campaign {record.campaign_id} has {record.state.value}; it cannot be {verb}",
        reason=ErrorReason.CAMPAIGN_ENDED,
        metadata={"campaign_id": record.campaign_id, "state": record.state.value},
    )
