"""The lease helper: renews what this process holds, ends as failed what expired elsewhere."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from quarry.lease import LeaseKeeper, LeaseTerms


class FakeLeases:
    """Lease times by id, all owned by one process unless said otherwise."""

    def __init__(self, heartbeats: dict[str, datetime]) -> None:
        self.heartbeats = heartbeats
        self.ended: list[str] = []

    async def renew(self, owner: str, ids: Sequence[str], now: datetime) -> None:
        for lease_id in ids:
            self.heartbeats[lease_id] = now

    async def expired(self, stale_before: datetime) -> list[str]:
        live = (lease_id for lease_id in self.heartbeats if lease_id not in self.ended)
        return [lease_id for lease_id in live if self.heartbeats[lease_id] < stale_before]

    async def end_as_failed(self, lease_id: str) -> bool:
        if lease_id in self.ended:
            return False
        self.ended.append(lease_id)
        return True


async def test_held_work_is_renewed_and_expired_work_of_others_is_ended() -> None:
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    leases = FakeLeases({"mine-late": long_ago, "orphan": long_ago, "fresh": datetime.now(UTC)})
    keeper = LeaseKeeper(
        "item",
        "owner-1",
        leases,
        held=lambda: {"mine-late"},
        take_over=leases.end_as_failed,
        terms=LeaseTerms(lease_seconds=30),
    )
    await keeper.renew_and_sweep()
    assert leases.ended == ["orphan"]
    assert leases.heartbeats["mine-late"] > long_ago


def test_renewals_come_every_third_of_a_lease_at_most_the_cap_apart() -> None:
    assert LeaseTerms(lease_seconds=3, max_interval_seconds=5).interval_seconds == 1
    assert LeaseTerms(lease_seconds=30, max_interval_seconds=2).interval_seconds == 2
