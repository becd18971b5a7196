"""Campaigns, their event logs and their directives in the supervisor's database.

As with runs, event sequence numbers come from a counter on the campaign's row, advanced in the
transaction that inserts the events, so they start at 1, have no gaps and follow commit order; the
counter's update also locks the row, which makes each write below one atomic step.

Two kinds of writer meet here. The loop driving a live campaign writes only while it still holds
it (the state is live and the row names it as owner): otherwise `CampaignLost`, and it must stop.
A human's pause, resume and stop change the state whoever drives the campaign, and the driver
notices on its next write or lease renewal. Nothing follows a campaign's ended event.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from quarry import ids
from quarry.db import Database, reserve_sequence_numbers
from quarry.errors import AlreadyExists, ErrorReason
from quarry.notify import notify_on_commit
from quarry.records.campaign import TrialRecord
from supervisor_svc.campaigns import events
from supervisor_svc.campaigns.events import Event
from supervisor_svc.campaigns.spec import CampaignSpec
from supervisor_svc.campaigns.state import (
    ENDED_STATES,
    LIVE_STATES,
    CampaignRecord,
    CampaignState,
    DirectiveRecord,
    DirectiveState,
    Phase,
    Progress,
    add_usage,
    branch_name,
    usage_in_window,
)
from supervisor_svc.hosting.store import HostedStore, WorkTables
from supervisor_svc.schema import campaign_directives, campaign_events, campaigns

# On PostgreSQL each event commit NOTIFYs this channel with the campaign id (streams on other replicas wake).
CAMPAIGN_EVENTS_CHANNEL = "quarry_campaign_events"
TABLES = WorkTables(campaigns, campaign_events, "campaign_id", LIVE_STATES, "campaign")


# Column values computed in the write's transaction, once the campaign's row is locked.
_Columns = Callable[[Connection, datetime], dict[str, Any]]


class CampaignLost(Exception):
    """The campaign is no longer this owner's to drive: paused, stopped, ended, gone or taken over."""


def _record(row: sa.Row[Any], now: datetime) -> CampaignRecord:
    return CampaignRecord(
        campaign_id=row.campaign_id,
        spec=CampaignSpec.from_json(row.spec),
        state=CampaignState(row.state),
        phase=Phase(row.phase),
        cycle=row.cycle,
        best_value=row.best_value,
        noise_floor=row.noise_floor,
        tokens=row.tokens,
        tokens_last_hour=usage_in_window(row.usage_window, now),
        cycles=row.cycles,
        branch=row.branch,
        scratchpad_thread_id=row.scratchpad_thread_id,
        pause_reason=row.pause_reason,
        end_reason=row.end_reason,
        pending_directives=row.pending_directives,
        last_sequence_no=row.last_sequence_no,
        sleep_until=row.sleep_until,
        sleep_reason=row.sleep_reason,
        resume_time=row.resume_time,
        create_time=row.create_time,
        update_time=row.update_time,
        end_time=row.end_time,
        created_by=row.created_by or "",
    )


def _directive(row: sa.Row[Any]) -> DirectiveRecord:
    return DirectiveRecord(
        campaign_id=row.campaign_id,
        request_id=row.request_id,
        text=row.text,
        state=DirectiveState(row.state),
        consumed_cycle=row.consumed_cycle,
        create_time=row.create_time,
        sent_by=row.sent_by or "",
    )


def _held(campaign_id: str, owner: str) -> sa.ColumnElement[bool]:
    return sa.and_(TABLES.live(campaign_id), campaigns.c.owner == owner)


def _in_states(campaign_id: str, states: Collection[CampaignState]) -> sa.ColumnElement[bool]:
    return sa.and_(campaigns.c.campaign_id == campaign_id, campaigns.c.state.in_([state.value for state in states]))


class CampaignStore(HostedStore[CampaignRecord]):
    def __init__(self, database: Database) -> None:
        super().__init__(database, TABLES, lambda row: _record(row, datetime.now(UTC)))

    # -- creating and reading --------------------------------------------------------------------------

    async def create(
        self, campaign_id: str, spec: CampaignSpec, request_id: str, owner: str, created_by: str = ""
    ) -> tuple[CampaignRecord, bool]:
        """Record a new queued campaign held by `owner`; with a request_id seen before, the campaign it
        started (created=False), or ALREADY_EXISTS when that one has another spec."""
        now = datetime.now(UTC)
        row: dict[str, Any] = {
            "campaign_id": campaign_id,
            "request_id": request_id or None,
            "request_digest": spec.digest(),
            "spec": spec.to_json(),
            "state": CampaignState.QUEUED.value,
            "phase": Phase.IDLE.value,
            "cycle": 0,
            "best_value": None,
            "noise_floor": None,
            "tokens": 0,
            "usage_window": [],
            "cycles": 0,
            "branch": branch_name(campaign_id),
            "scratchpad_thread_id": campaign_id,
            "pause_reason": "",
            "end_reason": "",
            "pending_directives": 0,
            "last_sequence_no": 0,
            "sleep_until": None,
            "sleep_reason": "",
            "resume_time": None,
            "owner": owner,
            "heartbeat_time": now,
            "create_time": now,
            "update_time": now,
            "end_time": None,
            "created_by": created_by,
        }
        return await self._insert(row, request_id, spec)

    async def list_campaigns(
        self, page_size: int, page_token: str, state: CampaignState | None
    ) -> tuple[list[CampaignRecord], str]:
        """Newest first; the token carries the filter, so a page cannot silently change what it lists."""
        state_name = state.value if state else ""
        return await self._page(page_size, page_token, state_name, ids.CAMPAIGN_ID, "ListCampaigns")

    # -- the loop's writes: only while it holds the campaign ------------------------------------------

    async def append(self, campaign_id: str, owner: str, batch: Sequence[Event], *, key: str = "") -> bool:
        """Number and store events; with `key`, only if no event was stored under it before (False then)."""
        return await self._write(campaign_id, batch, _held(campaign_id, owner), key=key)

    async def set_phase(self, campaign_id: str, owner: str, phase: Phase, cycle: int, message: str) -> None:
        """The loop is at `phase` of `cycle`: the campaign runs (no longer queued or sleeping)."""
        columns = {
            "phase": phase.value,
            "cycle": cycle,
            "state": CampaignState.RUNNING.value,
            "sleep_until": None,
            "sleep_reason": "",
        }
        batch = [events.phase_changed(phase, cycle, message)]
        await self._write(campaign_id, batch, _held(campaign_id, owner), columns=columns)

    async def sleep(self, campaign_id: str, owner: str, until: datetime, reason: str) -> None:
        columns = {
            "state": CampaignState.SLEEPING.value,
            "phase": Phase.IDLE.value,
            "sleep_until": until,
            "sleep_reason": reason,
        }
        await self._write(campaign_id, [events.sleeping(reason, until)], _held(campaign_id, owner), columns=columns)

    async def record_usage(self, campaign_id: str, owner: str, tokens: int) -> None:
        """Tokens the campaign used now (counted in its total and in its last hour)."""
        if tokens < 0:
            raise ValueError("tokens must not be negative")

        def columns(connection: Connection, now: datetime) -> dict[str, Any]:
            window = connection.execute(
                sa.select(campaigns.c.usage_window).where(campaigns.c.campaign_id == campaign_id)
            ).scalar_one()
            return {"tokens": campaigns.c.tokens + tokens, "usage_window": add_usage(window, now, tokens)}

        await self._write(campaign_id, [], _held(campaign_id, owner), columns=columns)

    async def record_trial(self, campaign_id: str, owner: str, record: TrialRecord, progress: Progress) -> bool:
        """The cycle's ledger row, once (False when it was recorded before): the cycle counts, and GetCampaign
        shows the progress. Its tokens are not counted again (record_usage counts them as they are used)."""
        columns: dict[str, Any] = {"cycles": campaigns.c.cycles + 1}
        if progress.best_value is not None:
            columns["best_value"] = progress.best_value
        if progress.noise_floor is not None:
            columns["noise_floor"] = progress.noise_floor
        batch = [events.ledger_recorded(record)]
        key = f"ledger:{record.cycle}"
        return await self._write(campaign_id, batch, _held(campaign_id, owner), columns=columns, key=key)

    async def pending_directives(self, campaign_id: str) -> list[DirectiveRecord]:
        """The directives no THINK has consumed yet, in the order they came."""
        d = campaign_directives.c
        query = (
            sa.select(campaign_directives)
            .where(d.campaign_id == campaign_id, d.state == DirectiveState.PENDING.value)
            .order_by(d.position)
        )
        return await self._db.read(lambda connection: [_directive(row) for row in connection.execute(query)])

    async def consume_directives(
        self, campaign_id: str, owner: str, request_ids: Sequence[str], cycle: int
    ) -> list[DirectiveRecord]:
        """Mark pending directives consumed by the THINK of `cycle`, each with its event, in one transaction.

        Exactly once: a directive consumed before (by this call's retry, or another) is not returned again.
        """
        now = datetime.now(UTC)
        d = campaign_directives.c

        def work(connection: Connection) -> list[DirectiveRecord]:
            taken = connection.execute(
                campaign_directives.update()
                .where(
                    d.campaign_id == campaign_id,
                    d.request_id.in_(list(request_ids)),
                    d.state == DirectiveState.PENDING.value,
                )
                .values(state=DirectiveState.CONSUMED.value, consumed_cycle=cycle, consume_time=now)
                .returning(*campaign_directives.c)
            ).all()
            consumed = [_directive(row) for row in sorted(taken, key=lambda row: row.position)]
            batch = [events.directive_consumed(directive.request_id, cycle) for directive in consumed]
            columns = {"pending_directives": campaigns.c.pending_directives - len(consumed)}
            # Raises CampaignLost, which rolls the consumption back with everything else.
            self._write_in(connection, campaign_id, batch, _held(campaign_id, owner), columns, now)
            return consumed

        return await self._db.write(work)

    async def finish(self, campaign_id: str, owner: str, state: CampaignState, reason: str) -> None:
        """The loop ends the campaign (completed or failed): its ended event and columns, together."""
        columns = {"state": state.value, "end_reason": reason, "end_time": datetime.now(UTC)}
        await self._write(campaign_id, [events.ended(state, reason)], _held(campaign_id, owner), columns=columns)

    async def pause_held(self, campaign_id: str, owner: str, reason: str) -> None:
        """The loop pauses the campaign it drives (too many failed cycles in a row)."""
        columns = {"state": CampaignState.PAUSED.value, "pause_reason": reason, "phase": Phase.IDLE.value}
        await self._write(campaign_id, [events.paused(reason)], _held(campaign_id, owner), columns=columns)

    # -- a human's changes, whoever drives the campaign -----------------------------------------------

    async def transition(
        self,
        campaign_id: str,
        from_states: Collection[CampaignState],
        to: CampaignState,
        event: Event,
        columns: dict[str, Any] | None = None,
    ) -> bool:
        """Move the campaign from one of `from_states` to `to` with its event; False when it is in none of them
        (or does not exist)."""
        values = {**(columns or {}), "state": to.value}
        if to.ended:
            values["end_time"] = datetime.now(UTC)
        try:
            await self._write(campaign_id, [event], _in_states(campaign_id, from_states), columns=values)
        except CampaignLost:
            return False
        return True

    async def add_directive(
        self, campaign_id: str, request_id: str, text: str, sent_by: str = ""
    ) -> tuple[DirectiveRecord, bool] | None:
        """Record a pending directive with its event; with a request_id seen before, that directive
        (created=False), or ALREADY_EXISTS when it said something else. None when the campaign has ended
        or does not exist."""
        now = datetime.now(UTC)
        d = campaign_directives.c
        ongoing = sa.and_(campaigns.c.campaign_id == campaign_id, campaigns.c.state.not_in(ENDED_STATES))

        def work(connection: Connection) -> tuple[DirectiveRecord, bool] | None:
            existing = connection.execute(
                sa.select(campaign_directives).where(d.campaign_id == campaign_id, d.request_id == request_id)
            ).first()
            if existing is not None:
                if existing.text != text:
                    raise AlreadyExists(
                        f"request_id {request_id!r} already sent a different directive",
                        reason=ErrorReason.REQUEST_ID_REUSED,
                        metadata={"campaign_id": campaign_id},
                    )
                return _directive(existing), False
            position = reserve_sequence_numbers(connection, campaigns, ongoing, 1)
            if position is None:
                return None
            row = {
                "campaign_id": campaign_id,
                "request_id": request_id,
                "text": text,
                "state": DirectiveState.PENDING.value,
                "position": position,
                "consumed_cycle": 0,
                "create_time": now,
                "consume_time": None,
                "sent_by": sent_by,
            }
            connection.execute(campaign_directives.insert().values(row))
            received = events.directive_received(request_id, text, sent_by)
            self._insert_events(connection, campaign_id, position, [received], now)
            connection.execute(
                campaigns.update()
                .where(campaigns.c.campaign_id == campaign_id)
                .values(pending_directives=campaigns.c.pending_directives + 1, update_time=now)
            )
            notify_on_commit(connection, CAMPAIGN_EVENTS_CHANNEL, campaign_id)
            return DirectiveRecord(campaign_id, request_id, text, DirectiveState.PENDING, 0, now, sent_by), True

        return await self._db.write(work)

    # -- leases --------------------------------------------------------------------------------------------

    async def take_over_record(self, campaign_id: str, owner: str, stale_before: datetime) -> CampaignRecord | None:
        """Make `owner` the driver of a live campaign whose lease expired, and its record; None when another
        got it first, or it is no longer live or expired."""
        if not await self.take_over(campaign_id, owner, stale_before):
            return None
        return await self.get(campaign_id)

    # -- the one way events are written ----------------------------------------------------------------

    async def _write(
        self,
        campaign_id: str,
        batch: Sequence[Event],
        condition: sa.ColumnElement[bool],
        *,
        columns: dict[str, Any] | _Columns | None = None,
        key: str = "",
    ) -> bool:
        """Number and store events and update the campaign's columns in one transaction, only while
        `condition` holds (else CampaignLost). With `key`, nothing happens if an event was stored under it
        (False). `columns` may be a function of the connection and the time, called once the row is locked."""
        now = datetime.now(UTC)

        def work(connection: Connection) -> bool:
            if key:
                # Lock the row first (and check the condition), so two writers of one key take turns.
                if reserve_sequence_numbers(connection, campaigns, condition, 0) is None:
                    raise CampaignLost(campaign_id)
                if self._has_key(connection, campaign_id, key):
                    return False
            values = columns(connection, now) if callable(columns) else columns
            self._write_in(connection, campaign_id, batch, condition, values, now, key=key)
            return True

        return await self._db.write(work)

    def _write_in(
        self,
        connection: Connection,
        campaign_id: str,
        batch: Sequence[Event],
        condition: sa.ColumnElement[bool],
        columns: dict[str, Any] | None,
        now: datetime,
        *,
        key: str = "",
    ) -> None:
        first = reserve_sequence_numbers(connection, campaigns, condition, len(batch))
        if first is None:
            raise CampaignLost(campaign_id)
        self._insert_events(connection, campaign_id, first, batch, now, key=key)
        connection.execute(
            campaigns.update()
            .where(campaigns.c.campaign_id == campaign_id)
            .values({**(columns or {}), "update_time": now})
        )
        if batch:
            notify_on_commit(connection, CAMPAIGN_EVENTS_CHANNEL, campaign_id)

    @staticmethod
    def _insert_events(
        connection: Connection, campaign_id: str, first: int, batch: Sequence[Event], now: datetime, *, key: str = ""
    ) -> None:
        rows = [
            {
                "campaign_id": campaign_id,
                "sequence_no": first + offset,
                "payload": event.stored(campaign_id, first + offset, now),
                "terminal": event.terminal,
                # A batch under one key is one fact: the key marks its first event.
                "dedupe_key": (key or None) if offset == 0 else None,
                "create_time": now,
            }
            for offset, event in enumerate(batch)
        ]
        if rows:
            connection.execute(campaign_events.insert(), rows)

    @staticmethod
    def _has_key(connection: Connection, campaign_id: str, key: str) -> bool:
        e = campaign_events.c
        query = sa.select(e.sequence_no).where(e.campaign_id == campaign_id, e.dedupe_key == key)
        return connection.execute(query).first() is not None
