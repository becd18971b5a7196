"""Leases on live work (a supervisor's runs, a worker's delegations), so that a process that dies never
leaves its work "running" forever.

Each row of live work names its owner process and when the owner last renewed it. The owner renews
the leases of the work it still runs at an interval; every process also sweeps for leases nobody
renewed for `lease_seconds` and ends that work as failed. A service's store supplies the SQL
(`LeaseStore`) and how to end one item (`end_as_failed`); the timing, the skipping of work this
process still runs, and the error handling live here once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from quarry import telemetry
from quarry.background import BackgroundTask

__all__ = ["LeaseKeeper", "LeaseStore", "LeaseTerms"]

log = logging.getLogger(__name__)


class LeaseStore(Protocol):
    async def renew(self, owner: str, ids: Sequence[str], now: datetime) -> None:
        """Set the lease time of those `ids` that `owner` holds and that are still live."""

    async def expired(self, stale_before: datetime) -> list[str]:
        """The live work whose lease was last renewed before `stale_before` (or never)."""


@dataclass(frozen=True)
class LeaseTerms:
    # Live work whose owner has not renewed its lease for this long is ended as failed.
    lease_seconds: float = 30.0
    # Renewals (and sweeps) come every third of a lease, but at least this often.
    max_interval_seconds: float = 5.0

    @property
    def interval_seconds(self) -> float:
        return min(self.lease_seconds / 3, self.max_interval_seconds)


class LeaseKeeper(BackgroundTask):
    """The background task that renews one process's leases and ends the work of owners that stopped.

    `held` lists the ids this process runs now; `end_as_failed(id)` ends one expired item and says
    whether this call ended it (False when another process got there first).
    """

    def __init__(
        self,
        kind: str,
        owner: str,
        store: LeaseStore,
        *,
        held: Callable[[], Collection[str]],
        end_as_failed: Callable[[str], Awaitable[bool]],
        terms: LeaseTerms,
    ) -> None:
        super().__init__(f"{kind}-leases")
        self._kind = kind
        self.owner = owner
        self._store = store
        self._held = held
        self._end_as_failed = end_as_failed
        self._terms = terms

    async def _run(self) -> None:
        """Renew and sweep now, then every interval until stopped."""
        while True:
            try:
                with telemetry.quiet():  # housekeeping: no spans
                    await self.renew_and_sweep()
            except Exception:
                log.exception("could not renew %s leases; retrying", self._kind)
            await asyncio.sleep(self._terms.interval_seconds)

    async def renew_and_sweep(self) -> None:
        now = datetime.now(UTC)
        held = set(self._held())
        if held:
            await self._store.renew(self.owner, sorted(held), now)
        stale_before = now - timedelta(seconds=self._terms.lease_seconds)
        for expired_id in await self._store.expired(stale_before):
            if expired_id in held:  # still running here: its renewal was late, not its owner gone
                continue
            if await self._end_as_failed(expired_id):
                log.warning("%s %s: its owner stopped renewing the lease; ended as failed", self._kind, expired_id)
