"""Delegation records: what ran, its state, last_error and timestamps, and its recorded outcome."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from quarry.agent.conversation import insert_conversation
from quarry.agent.messages import Message
from quarry.agent.usage import Usage
from quarry.db import Database, Prepared
from quarry.errors import ErrorReason, FailedPrecondition
from quarry.identity import Role
from quarry.vocabulary import DelegationErrorCode, DelegationResult, JobRef, Tier
from worker_svc.delegations import DelegationRecord, DelegationRequest, DelegationState
from worker_svc.schema import delegations


def _record(row: sa.Row[Any]) -> DelegationRecord:
    outcome = (
        _result_from_json(row.delegation_id, row.tool_call_id, row.conversation_id, row.result, row.worker_id)
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
        state=DelegationState(row.state),
        outcome=outcome,
        last_error=row.last_error,
        create_time=row.create_time,
        end_time=row.end_time,
        worker_id=row.worker_id,
        workspace_id=row.task.get("workspace_id", ""),
        question=str(row.task.get("question", "")),
        tier=Tier(row.task["tier"]) if row.task.get("tier") else None,
        interrupted=bool(row.result is not None and row.result.get("interrupted")),
    )


_RUNNING = delegations.c.state == DelegationState.RUNNING.value
# A delegation's start and end are on its critical path: prepared once.
_INSERT = Prepared(delegations.insert(), columns=[column.name for column in delegations.c])
_END = Prepared(
    delegations.update()
    .where(delegations.c.delegation_id == sa.bindparam("key"))
    .values({name: sa.bindparam(name) for name in ("state", "result", "last_error", "end_time")})
)


def _result_json(result: DelegationResult) -> dict[str, object]:
    """A result as its row keeps it (usage flat, as results were always stored)."""
    return {
        "succeeded": result.succeeded,
        "summary": result.summary,
        "error_code": result.error_code.value if result.error_code else None,
        "error_message": result.error_message,
        "promoted": list(result.promoted),
        "turns": result.turns,
        **result.usage.to_json(),
        "jobs": [dataclasses.asdict(job) for job in result.jobs],
        "files_changed": list(result.files_changed),
        "output_kind": result.output_kind,
        "output_json": result.output_json,
        "output_sequence_no": result.output_sequence_no,
        "tier": result.tier.value if result.tier else None,
        "model": result.model,
    }


def _result_from_json(
    delegation_id: str, tool_call_id: str, conversation_id: str, data: dict[str, Any], worker_id: str
) -> DelegationResult:
    code = data.get("error_code")
    error_code = DelegationErrorCode(str(code)) if code else None
    if not data["succeeded"] and error_code is None:  # every failure names its code; be safe with old rows
        error_code = DelegationErrorCode.INTERNAL
    return DelegationResult(
        delegation_id=delegation_id,
        tool_call_id=tool_call_id,
        conversation_id=conversation_id,
        error_code=error_code,
        error_message=str(data.get("error_message", "")),
        summary=str(data.get("summary", "")),
        promoted=tuple(int(n) for n in data.get("promoted") or []),
        turns=int(data.get("turns", 0)),
        usage=Usage.from_json(data),
        worker_id=worker_id,
        jobs=tuple(JobRef(**job) for job in data.get("jobs") or []),
        files_changed=tuple(str(path) for path in data.get("files_changed") or []),
        output_kind=str(data.get("output_kind") or ""),
        output_json=str(data.get("output_json") or ""),
        output_sequence_no=int(data.get("output_sequence_no") or 0),
        tier=Tier(data["tier"]) if data.get("tier") else None,
        model=str(data.get("model") or ""),
    )


def _ended(outcome: DelegationResult, *, interrupted: bool = False) -> dict[str, Any]:
    """The columns that record a delegation's end; `interrupted` when it was stopped from outside (its caller
    went away, its worker stopped), so that the same Delegate later goes on with it."""
    result = _result_json(outcome)
    if interrupted:
        result["interrupted"] = True
    return {
        "state": (DelegationState.SUCCEEDED if outcome.succeeded else DelegationState.FAILED).value,
        "result": result,
        "last_error": "" if outcome.succeeded else f"{outcome.error_code}: {outcome.error_message}",
        "end_time": datetime.now(UTC),
    }


class DelegationStore:
    def __init__(self, database: Database, owner: str = "", worker_id: str = "") -> None:
        self._db = database
        # The lease holder: unique to this process, whatever the worker's configured id.
        self.owner = owner or f"worker-{uuid.uuid4().hex[:12]}"
        # What the delegations this process runs are recorded as run by.
        self.worker_id = worker_id

    async def get(self, delegation_id: str) -> DelegationRecord | None:
        def work(connection: Connection) -> DelegationRecord | None:
            row = connection.execute(sa.select(delegations).where(delegations.c.delegation_id == delegation_id)).first()
            return _record(row) if row is not None else None

        return await self._db.read(work)

    async def start(
        self, request: DelegationRequest, conversation_id: str, opening: Sequence[Message], tier: Tier
    ) -> None:
        """Record a delegation as running on `tier`, with its new conversation, in one transaction; a second
        start of the same id is refused."""
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
                "workspace_id": request.workspace_id,
                "question": request.question,
                "tier": tier.value,
            },
            "state": DelegationState.RUNNING.value,
            "result": None,
            "last_error": "",
            "create_time": datetime.now(UTC),
            "end_time": None,
            "owner": self.owner,
            "heartbeat_time": datetime.now(UTC),
            "worker_id": self.worker_id,
        }
        try:

            def work(connection: Connection) -> None:
                _INSERT.execute(connection, row)
                insert_conversation(connection, conversation_id, opening)

            await self._db.write(work)
        except IntegrityError:
            raise FailedPrecondition(
                f"delegation {request.delegation_id!r} is already running",
                reason=ErrorReason.DELEGATION_RUNNING,
                metadata={"delegation_id": request.delegation_id},
            ) from None

    async def finish(self, outcome: DelegationResult, *, interrupted: bool = False) -> None:
        ended = {"key": outcome.delegation_id, **_ended(outcome, interrupted=interrupted)}
        await self._db.write(lambda connection: _END.execute(connection, ended))

    async def reopen(self, delegation_id: str) -> bool:
        """Take an interrupted delegation up again, as running here; False when it is not (or no longer) one
        that was interrupted, e.g. because a concurrent Delegate took it first."""

        def work(connection: Connection) -> bool:
            row = connection.execute(
                sa.select(delegations.c.result).where(delegations.c.delegation_id == delegation_id)
            ).first()
            if row is None or row.result is None or not row.result.get("interrupted"):
                return False
            now = datetime.now(UTC)
            reopened = connection.execute(
                delegations.update()
                .where(delegations.c.delegation_id == delegation_id, sa.not_(_RUNNING))
                .values(
                    state=DelegationState.RUNNING.value,
                    result=None,
                    last_error="",
                    end_time=None,
                    owner=self.owner,
                    heartbeat_time=now,
                    worker_id=self.worker_id,
                )
            )
            return bool(reopened.rowcount)

        return await self._db.write(work)

    # -- leases (quarry.lease.LeaseStore) ----------------------------------------------------------

    async def renew(self, owner: str, ids: Sequence[str], now: datetime) -> None:
        """Renew `owner`'s lease on the delegations it is running."""
        mine = sa.and_(delegations.c.owner == owner, delegations.c.delegation_id.in_(ids), _RUNNING)
        await self._db.write(
            lambda connection: connection.execute(delegations.update().where(mine).values(heartbeat_time=now))
        )

    async def expired(self, stale_before: datetime) -> list[str]:
        """The running delegations whose worker has not renewed their lease since `stale_before`."""
        # No heartbeat at all: written before leases existed, by a worker that has since been replaced.
        expired = sa.or_(delegations.c.heartbeat_time < stale_before, delegations.c.heartbeat_time.is_(None))
        query = sa.select(delegations.c.delegation_id).where(_RUNNING, expired)
        return await self._db.read(lambda connection: list(connection.execute(query).scalars()))

    async def end_as_failed(self, delegation_id: str) -> bool:
        """End a delegation whose worker stopped as failed; False when it had already ended."""

        def work(connection: Connection) -> bool:
            row = connection.execute(
                sa.select(delegations.c.tool_call_id, delegations.c.conversation_id, delegations.c.worker_id).where(
                    delegations.c.delegation_id == delegation_id
                )
            ).first()
            if row is None:
                return False
            outcome = DelegationResult(
                delegation_id=delegation_id,
                tool_call_id=row.tool_call_id,
                conversation_id=row.conversation_id,
                error_code=DelegationErrorCode.INTERNAL,
                error_message="the worker running this delegation stopped before it ended",
                worker_id=row.worker_id,
            )
            # Conditional on the state still being "running": two sweepers end it once.
            still_running = sa.and_(delegations.c.delegation_id == delegation_id, _RUNNING)
            ended = _ended(outcome, interrupted=True)
            done = connection.execute(delegations.update().where(still_running).values(ended))
            return bool(done.rowcount)

        return await self._db.write(work)
