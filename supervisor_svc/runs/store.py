"""Runs and their event logs in the supervisor's database.

Event sequence numbers come from a counter on the run's row, advanced in the
same transaction as the event inserts, so they start at 1, have no gaps and
follow commit order. An event is only accepted while the run is active, so the
terminal event is always the last one, whichever process writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from quarry import ids
from quarry.db import Database, reserve_sequence_numbers
from quarry.notify import notify_on_commit
from quarry.records.verification import Verification
from supervisor_svc.hosting.store import HostedStore, WorkTables
from supervisor_svc.runs import events
from supervisor_svc.runs.domain import (
    ACTIVE_STATES,
    Approval,
    ApprovalDecision,
    Report,
    RunErrorCode,
    RunOptions,
    RunOutcome,
    RunRecord,
    RunState,
    RunUsage,
    RunWarning,
    StartRequest,
)
from supervisor_svc.runs.events import PublicEvent
from supervisor_svc.schema import run_events, runs

# On PostgreSQL each event commit NOTIFYs this channel with the run id, so streams served by other
# replicas wake at once.
RUN_EVENTS_CHANNEL = "quarry_run_events"
TABLES = WorkTables(runs, run_events, "run_id", ACTIVE_STATES, "run")


class RunEnded(Exception):
    """The run has ended (or does not exist): it takes no more events."""


def _record(row: sa.Row[Any]) -> RunRecord:
    return RunRecord(
        run_id=row.run_id,
        question=row.question,
        state=RunState(row.state),
        options=RunOptions.from_json(row.options),
        labels=dict(row.labels),
        scratchpad_thread_id=row.scratchpad_thread_id,
        report=Report.from_json(row.report) if row.report is not None else None,
        error_code=RunErrorCode(row.error_code) if row.error_code else None,
        last_error=row.last_error,
        usage=RunUsage.from_json(row.usage),
        last_sequence_no=row.last_sequence_no,
        create_time=row.create_time,
        start_time=row.start_time,
        end_time=row.end_time,
        cancel_reason=(row.cancel_reason or "") if row.state == RunState.CANCELLED.value else "",
        warnings=tuple(RunWarning(w) for w in row.warnings or () if w in _KNOWN_WARNINGS),
        verification=Verification.from_json(row.verification) if row.verification is not None else None,
        approval=_approval(row) if row.approval else None,
        created_by=row.created_by or "",
    )


def _approval(row: Any) -> Approval:
    return Approval(ApprovalDecision(row.approval), row.approval_note or "", row.decided_by or "")


# A warning a later release recorded and this one does not know is left out, not an error.
_KNOWN_WARNINGS = frozenset(warning.value for warning in RunWarning)


class RunStore(HostedStore[RunRecord]):
    def __init__(self, database: Database) -> None:
        super().__init__(database, TABLES, _record)

    async def create(
        self, run_id: str, request: StartRequest, scratchpad_thread_id: str, owner: str, created_by: str = ""
    ) -> tuple[RunRecord, bool]:
        """Record a new queued run; with a request_id seen before, the run it started (created=False)."""
        now = datetime.now(UTC)
        row = {
            "run_id": run_id,
            "request_id": request.request_id or None,
            "request_digest": request.digest(),
            "question": request.question,
            "options": request.options.to_json(),
            "labels": request.labels,
            "scratchpad_thread_id": scratchpad_thread_id,
            "state": RunState.QUEUED.value,
            "report": None,
            "error_code": "",
            "last_error": "",
            "usage": RunUsage().to_json(),
            "last_sequence_no": 0,
            "owner": owner,
            "heartbeat_time": now,
            "cancel_reason": None,
            "create_time": now,
            "created_by": created_by,
        }
        return await self._insert(row, request.request_id, request)

    async def list_runs(self, page_size: int, page_token: str, state: RunState | None) -> tuple[list[RunRecord], str]:
        """Newest first; the token carries the filter, so a page cannot silently change what it lists."""
        return await self._page(page_size, page_token, state.value if state else "", ids.RUN_ID, "ListRuns")

    async def append(self, run_id: str, events: Sequence[PublicEvent]) -> None:
        """Number and store events. Raises RunEnded when the run is no longer active."""
        await self._write_events(run_id, events)

    async def mark_running(self, run_id: str, event: PublicEvent) -> None:
        """The run has started executing: its state, start time and the event that says so, together."""
        await self._write_events(
            run_id, [event], columns={"state": RunState.RUNNING.value, "start_time": datetime.now(UTC)}
        )

    async def record_usage(self, run_id: str, event: PublicEvent, usage: RunUsage) -> None:
        """An event after which the run's usage so far is `usage` (kept on the row for GetRun)."""
        await self._write_events(run_id, [event], columns={"usage": usage.to_json()})

    async def record_verification(self, run_id: str, event: PublicEvent, verification: Verification) -> None:
        """An event after which the run's verification so far is `verification` (kept on the row for GetRun)."""
        await self._write_events(run_id, [event], columns={"verification": verification.to_json()})

    async def await_approval(
        self, run_id: str, event: PublicEvent, report: Report, verification: Verification | None
    ) -> None:
        """The run is done but for a person's decision: its state, the report to decide on and the event that
        says so, together."""
        columns: dict[str, Any] = {"state": RunState.AWAITING_APPROVAL.value, "report": report.to_json()}
        if verification is not None:
            columns["verification"] = verification.to_json()
        await self._write_events(run_id, [event], columns=columns)

    async def decide(self, run_id: str, approval: Approval) -> bool:
        """Record the decision on a run awaiting approval; False when it is not awaiting one, or a decision
        was already taken (the first one stands)."""
        undecided = sa.and_(
            runs.c.run_id == run_id,
            runs.c.state == RunState.AWAITING_APPROVAL.value,
            runs.c.approval.is_(None),
        )
        values = {
            "approval": approval.decision.value,
            "approval_note": approval.note,
            "decided_by": approval.decided_by,
        }

        def work(connection: Connection) -> bool:
            return connection.execute(runs.update().where(undecided).values(values)).rowcount == 1

        return await self._db.write(work)

    async def decisions(self, owner: str, ids: Sequence[str]) -> list[tuple[str, Approval]]:
        """The decisions taken (here or by another replica) on runs `owner` executes that still await them."""
        query = sa.select(runs.c.run_id, runs.c.approval, runs.c.approval_note, runs.c.decided_by).where(
            runs.c.owner == owner,
            runs.c.run_id.in_(ids),
            runs.c.state == RunState.AWAITING_APPROVAL.value,
            runs.c.approval.is_not(None),
        )
        return await self._db.read(
            lambda connection: [(row.run_id, _approval(row)) for row in connection.execute(query)]
        )

    async def finish(self, run_id: str, outcome: RunOutcome) -> None:
        """End the run: its terminal event and its final columns, in one transaction.

        Raises RunEnded when the run had already ended (here or on another replica).
        """
        columns: dict[str, Any] = {
            "state": outcome.state.value,
            "usage": outcome.usage.to_json(),
            "end_time": datetime.now(UTC),
            "report": outcome.report.to_json() if outcome.report else None,
            "warnings": [warning.value for warning in outcome.warnings] or None,
        }
        if outcome.verification is not None:  # else what the run saved while verifying stays
            columns["verification"] = outcome.verification.to_json()
        if outcome.state is RunState.CANCELLED:
            columns["cancel_reason"] = outcome.message
        elif outcome.error_code is not None:
            columns["error_code"], columns["last_error"] = outcome.error_code.value, outcome.message
        await self._write_events(run_id, [events.ending(outcome)], columns=columns, terminal=True)

    async def _write_events(
        self,
        run_id: str,
        events: Sequence[PublicEvent],
        *,
        columns: dict[str, Any] | None = None,
        terminal: bool = False,
    ) -> None:
        """Number and store events and update the run's columns in one transaction; only while it is active,
        so nothing ever follows a terminal event."""
        now = datetime.now(UTC)

        def work(connection: Connection) -> None:
            active = sa.and_(runs.c.run_id == run_id, runs.c.state.in_(ACTIVE_STATES))
            first = reserve_sequence_numbers(connection, runs, active, len(events))
            if first is None:
                raise RunEnded(run_id)
            rows = []
            for offset, event in enumerate(events):
                sequence_no = first + offset
                last = offset == len(events) - 1
                rows.append(
                    {
                        "run_id": run_id,
                        "sequence_no": sequence_no,
                        "payload": event.stored(run_id, sequence_no, now),
                        "terminal": terminal and last,
                        "create_time": now,
                    }
                )
            if rows:
                connection.execute(run_events.insert(), rows)
            if columns:
                connection.execute(runs.update().where(runs.c.run_id == run_id).values(columns))
            notify_on_commit(connection, RUN_EVENTS_CHANNEL, run_id)

        await self._db.write(work)

    async def cancel_requests(self, owner: str, ids: Sequence[str]) -> list[tuple[str, str]]:
        """(run_id, reason) for the cancellations asked of another replica for runs `owner` executes."""
        query = sa.select(runs.c.run_id, runs.c.cancel_reason).where(
            TABLES.held(owner, ids), runs.c.cancel_reason.is_not(None)
        )
        return await self._db.read(
            lambda connection: [(row.run_id, row.cancel_reason) for row in connection.execute(query)]
        )

    async def request_cancel(self, run_id: str, reason: str) -> None:
        active = sa.and_(runs.c.run_id == run_id, runs.c.state.in_(ACTIVE_STATES), runs.c.cancel_reason.is_(None))
        await self._db.write(
            lambda connection: connection.execute(runs.update().where(active).values(cancel_reason=reason))
        )
