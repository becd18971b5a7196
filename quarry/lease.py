"""Leases on live work (a supervisor's runs and campaigns, a worker's delegations), so that a process that
dies never leaves its work "running" forever.

Each row of live work names its owner process and when the owner last renewed it. The owner renews
the leases of the work it still runs at an interval; every process also sweeps for leases nobody
renewed for `lease_seconds` and takes that work over: a run or a delegation is ended as failed, a
campaign is resumed here. A service's store supplies the SQL (`LeaseStore`) and how to take over one
item (`take_over`); the timing, the skipping of work this process still runs, and the error
handling live here once.
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
from quarry.errors import Unavailable

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
    """The background task that renews one process's leases and takes over the work of owners that stopped.

    `held` lists the ids this process runs now; `take_over(id)` ends one expired item as failed, or
    resumes it here, and says whether this call did (False when another process got there first);
    `taken_over` says which, for the log.
    """

    def __init__(
        self,
        kind: str,
        owner: str,
        store: LeaseStore,
        *,
        held: Callable[[], Collection[str]],
        take_over: Callable[[str], Awaitable[bool]],
        terms: LeaseTerms,
        taken_over: str = "ended as failed",
    ) -> None:
        super().__init__(f"{kind}-leases")
        self._kind = kind
        self.owner = owner
        self._store = store
        self._held = held
        self._take_over = take_over
        self._terms = terms
        self._taken_over = taken_over

    async def _run(self) -> None:
        """Renew and sweep now, then every interval until stopped."""
        failing = False  # an outage is reported when it begins and when it ends, not at each retry
        while True:
            try:
                with telemetry.quiet():  # housekeeping: no spans
                    await self.renew_and_sweep()
            except Unavailable as error:
                if not failing:
                    log.warning("could not renew %s leases: %s; retrying quietly until it works", self._kind, error)
                failing = True
            except Exception:
                log.exception("could not renew %s leases; retrying", self._kind)
            else:
                if failing:
                    log.warning("%s leases are renewed again", self._kind)
                failing = False
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
            if await self._take_over(expired_id):
                log.warning("%s %s: its owner stopped renewing the lease; %s", self._kind, expired_id, self._taken_over)
