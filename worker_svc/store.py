"""Delegation records: what ran, its state, last_error and timestamps, and its recorded outcome."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from quarry.agent.conversation import insert_conversation
from quarry.agent.messages import Message
from quarry.db import Database
from quarry.errors import ErrorReason, FailedPrecondition
from quarry.identity import Role
from worker_svc.model import DelegationRecord, DelegationRequest, ErrorCode, Outcome
from worker_svc.schema import delegations


def _record(row: sa.Row[Any]) -> DelegationRecord:
    outcome = (
        Outcome.from_json(row.delegation_id, row.tool_call_id, row.conversation_id, row.result)
        if row.result is not None
        else None
    )
    return DelegationRecord(
        delegation_id=row.delegation_id,
        run_id=row.run_id,
        tool_call_id=row.tool_call_id,
        conversation_id=row.conversation_id,
        scratchpad_thread_id=row.scratchpad_thread_id,
        role=Role(row.role),
        objective=row.task["objective"],
        criteria=tuple(row.task["criteria"]),
        input_refs=tuple(row.task["input_refs"]),
        state=row.state,
        outcome=outcome,
        last_error=row.last_error,
        create_time=row.create_time,
        end_time=row.end_time,
    )


class DelegationStore:
    def __init__(self, database: Database, owner: str = "") -> None:
        self._db = database
        self.owner = owner or f"worker-{uuid.uuid4().hex[:12]}"

    async def get(self, delegation_id: str) -> DelegationRecord | None:
        def work(connection: Connection) -> DelegationRecord | None:
            row = connection.execute(sa.select(delegations).where(delegations.c.delegation_id == delegation_id)).first()
            return _record(row) if row is not None else None

        return await self._db.read(work)

    async def start(self, request: DelegationRequest, conversation_id: str, opening: Sequence[Message]) -> None:
        """Record a delegation as running, with its new conversation, in one transaction; a second start of
        the same id is refused."""
        assert request.role is not None
        row = {
            "delegation_id": request.delegation_id,
            "run_id": request.run_id,
            "tool_call_id": request.tool_call_id,
            "conversation_id": conversation_id,
            "scratchpad_thread_id": request.scratchpad_thread_id,
            "role": request.role.value,
            "task": {
                "objective": request.objective,
                "criteria": list(request.criteria),
                "input_refs": list(request.input_refs),
            },
            "state": "running",
            "result": None,
            "last_error": "",
            "create_time": datetime.now(UTC),
            "end_time": None,
            "owner": self.owner,
            "heartbeat_time": datetime.now(UTC),
        }
        try:

            def work(connection: Connection) -> None:
                connection.execute(delegations.insert().values(row))
                insert_conversation(connection, conversation_id, opening)

            await self._db.write(work)
        except IntegrityError:
            raise FailedPrecondition(
                f"delegation {request.delegation_id!r} is already running",
                reason=ErrorReason.DELEGATION_RUNNING,
                metadata={"delegation_id": request.delegation_id},
            ) from None

    async def finish(self, outcome: Outcome) -> None:
        values = {
            "state": "succeeded" if outcome.succeeded else "failed",
            "result": outcome.to_json(),
            "last_error": "" if outcome.succeeded else f"{outcome.error_code}: {outcome.error_message}",
            "end_time": datetime.now(UTC),
        }
        await self._db.write(
            lambda connection: connection.execute(
                delegations.update().where(delegations.c.delegation_id == outcome.delegation_id).values(values)
            )
        )

    async def heartbeat(self, delegation_ids: Sequence[str]) -> None:
        """Renew this process's lease on the delegations it is running."""
        if not delegation_ids:
            return
        mine = sa.and_(
            delegations.c.owner == self.owner,
            delegations.c.delegation_id.in_(delegation_ids),
            delegations.c.state == "running",
        )
        now = datetime.now(UTC)
        await self._db.write(
            lambda connection: connection.execute(delegations.update().where(mine).values(heartbeat_time=now))
        )

    async def end_orphans(self, stale_before: datetime) -> list[str]:
        """End as failed the running delegations whose worker stopped renewing their lease; their ids."""

        def work(connection: Connection) -> list[str]:
            # No heartbeat at all: written before leases existed, by a worker that has since been replaced.
            expired = sa.or_(delegations.c.heartbeat_time < stale_before, delegations.c.heartbeat_time.is_(None))
            stale = sa.and_(delegations.c.state == "running", expired)
            rows = connection.execute(sa.select(delegations).where(stale)).all()
            ended = []
            for row in rows:
                outcome = Outcome(
                    delegation_id=row.delegation_id,
                    tool_call_id=row.tool_call_id,
                    conversation_id=row.conversation_id,
                    succeeded=False,
                    error_code=ErrorCode.INTERNAL,
                    error_message="the worker running this delegation stopped before it ended",
                )
                # Conditional on the state still being "running": two sweepers end it once.
                done = connection.execute(
                    delegations.update()
                    .where(delegations.c.delegation_id == row.delegation_id, delegations.c.state == "running")
                    .values(
                        state="failed",
                        result=outcome.to_json(),
                        last_error=f"{outcome.error_code}: {outcome.error_message}",
                        end_time=datetime.now(UTC),
                    )
                )
                if done.rowcount:
                    ended.append(row.delegation_id)
            return ended

        return await self._db.write(work)
