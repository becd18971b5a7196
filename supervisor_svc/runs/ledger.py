"""The run's research ledger, as the supervisor keeps it: who was asked what, where it ran, what it cost.

For every delegation, researchers' and evidence roles' alike, three typed entries on the run's thread
(quarry.records.research): the Assignment before it starts (role, contract, input refs), the
RouteDecision once a worker has taken it (worker, tier, model), and UsageObserved when it ends (the
token counts the model endpoint reported). What the role itself records (findings, a verdict, an audit
and its objections, an adjudication) falls between them, so the thread reads in the order it happened.

Request ids derive from the delegation, so a retried append writes nothing twice. A ledger entry that
cannot be written is logged and the delegation goes on: the work it records is not undone by a
scratchpad hiccup, and the entries that were written stay gap-free.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

import grpc
from pydantic import ValidationError

from quarry.errors import QuarryError
from quarry.identity import Principal, Role
from quarry.records.research import TASK_KINDS, Assignment, ResearchRecord, RouteDecision, UsageObserved
from quarry.research_plane import ResearchPlane
from quarry.vocabulary import DelegationResult, Tier

log = logging.getLogger(__name__)


class LedgerUnwritable(Exception):
    """An entry the run's verification depends on could not be written: the run fails rather than let its
    ledger say more than it decided."""


class RunLedger:
    def __init__(self, scratchpad: ResearchPlane, run_id: str, thread_id: str) -> None:
        self._scratchpad = scratchpad
        self._run_id = run_id
        self._thread_id = thread_id
        self._author = Principal(run_id, Role.SUPERVISOR)

    async def assigned(
        self, delegation_id: str, role: Role, objective: str, criteria: tuple[str, ...], input_refs: tuple[str, ...]
    ) -> None:
        await self._write(
            delegation_id,
            "assignment",
            lambda: Assignment(
                delegation_id=delegation_id,
                role=role,
                task_kind=TASK_KINDS.get(role),
                objective=objective,
                criteria=criteria,
                input_refs=input_refs,
            ),
        )

    async def routed(self, delegation_id: str, worker_id: str, tier: Tier | None, model: str) -> None:
        if not worker_id or tier is None or not model:  # an older worker that does not say: nothing to record
            return
        await self._write(
            delegation_id,
            "route",
            lambda: RouteDecision(delegation_id=delegation_id, worker_id=worker_id, tier=tier, model=model),
        )

    async def used(self, result: DelegationResult) -> None:
        usage = result.usage
        await self._write(
            result.delegation_id,
            "usage",
            lambda: UsageObserved(
                delegation_id=result.delegation_id,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                model_calls=usage.model_calls,
            ),
        )

    async def _write(self, delegation_id: str, part: str, record: Callable[[], ResearchRecord]) -> None:
        digest = hashlib.sha256(delegation_id.encode()).hexdigest()[:32]
        await self.record(record, f"ledger/{digest}/{part}", f"the {part} of delegation {delegation_id}")

    async def require(self, record: Callable[[], ResearchRecord], key: str, what: str) -> int:
        """`record`, for an entry the run cannot go on without (its Verification would otherwise fold to more
        than the run decided): LedgerUnwritable when it could not be written."""
        written = await self.record(record, key, what)
        if not written:
            raise LedgerUnwritable(f"could not record {what} on the run's ledger; the run cannot stand behind it")
        return written

    async def record(self, record: Callable[[], ResearchRecord], key: str, what: str) -> int:
        """Append the record `record` builds as the run's supervisor, under the request id `<run>/<key>`; its
        entry's number, or 0 when it could not be written. One that does not validate (a contract the worker
        takes but the ledger's schema bounds more tightly, e.g. a blank criterion) is logged like an append
        that fails."""
        try:
            entry = record()
            appended = await self._scratchpad.append(
                self._thread_id,
                kind=entry.entry_kind,
                author=self._author,
                content=entry.model_dump_json(),
                request_id=f"{self._run_id}/{key}",
            )
        except (grpc.aio.AioRpcError, QuarryError, ValidationError) as error:
            log.warning("run %s: could not record %s: %s", self._run_id, what, error)
            return 0
        return appended.entry.sequence_no
