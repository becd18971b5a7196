"""The host on an in-memory store: starts de-duplicated by request id, admission, leases, stop and close."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from quarry.errors import ErrorReason, InvalidArgument, ResourceExhausted, Unavailable
from supervisor_svc.hosting.host import Host, HostLimits, Tenant
from supervisor_svc.hosting.store import StoredEvent


@dataclass(frozen=True)
class State:
    ended: bool = False


@dataclass(frozen=True)
class Record:
    key: str
    digest: str
    state: State = State()
    last_sequence_no: int = 0


@dataclass(frozen=True)
class Asked:
    what: str

    def digest(self) -> str:
        return self.what


@dataclass
class Store:
    """What the host asks of a tenant's store, in memory."""

    records: dict[str, Record] = field(default_factory=dict)
    by_request: dict[str, str] = field(default_factory=dict)
    renewals: list[list[str]] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    async def get(self, key: str, /) -> Record | None:
        return self.records.get(key)

    async def by_request_id(self, request_id: str, asked: Asked) -> Record | None:
        key = self.by_request.get(request_id)
        return self.records[key] if key is not None else None

    async def events_after(self, key: str, after: int, limit: int = 500) -> list[StoredEvent]:
        return []

    async def renew(self, owner: str, keys: Sequence[str], now: datetime) -> None:
        self.renewals.append(list(keys))

    async def expired(self, stale_before: datetime) -> list[str]:
        return list(self.stale)


@dataclass
class Work:
    key: str
    stopped_for: str = ""


@dataclass
class Tenancy:
    store: Store
    host: Host[Work, Record]
    renewed: list[list[str]]
    taken: list[str]
    gate: asyncio.Event  # the work's tasks run until it is set

    async def start(self, key: str, request_id: str = "", what: str = "a") -> Record:
        async def create() -> Record:
            await asyncio.sleep(0.01)  # the insert: concurrent starts overlap here
            record = Record(key, what)
            self.store.records[key] = record
            if request_id:
                self.store.by_request[request_id] = key
            self.host.launch(key, Work(key), self.gate.wait())  # type: ignore[arg-type]
            return record

        return await self.host.start_work(request_id, Asked(what), create)


def tenancy(max_active: int = 2) -> Tenancy:
    store = Store()
    renewed: list[list[str]] = []
    taken: list[str] = []

    async def on_renewal(keys: Sequence[str]) -> None:
        renewed.append(list(keys))

    async def take_over(key: str) -> bool:
        taken.append(key)
        return True

    tenant = Tenant(
        kind="thing",
        owner_prefix="things",
        start_method="StartThing",
        at_capacity=lambda most: ResourceExhausted(f"{most} things", reason=ErrorReason.TOO_MANY_RUNS),
        take_over=take_over,
        renewed=on_renewal,
    )
    hosted: Any = store  # the host only uses what Store has
    host: Host[Work, Record] = Host(tenant, hosted, HostLimits(max_active=max_active, stop_wait_seconds=1))
    return Tenancy(store, host, renewed, taken, asyncio.Event())


async def test_concurrent_starts_with_one_request_id_share_one_start_and_one_slot() -> None:
    things = tenancy(max_active=1)
    first, second = await asyncio.gather(things.start("t1", "req"), things.start("t2", "req"))
    assert first == second == things.store.records["t1"]
    assert "t2" not in things.store.records
    things.gate.set()


async def test_a_retry_gets_its_work_back_even_at_capacity() -> None:
    things = tenancy(max_active=1)
    started = await things.start("t1", "req")
    with pytest.raises(ResourceExhausted, match="1 things"):
        await things.start("t2", "other")
    assert await things.start("t3", "req") == started
    assert not things.host.has_room()
    things.gate.set()
    await asyncio.sleep(0.01)
    assert things.host.has_room()


async def test_a_start_without_a_request_id_is_never_shared() -> None:
    things = tenancy()
    await asyncio.gather(things.start("t1"), things.start("t2"))
    assert set(things.store.records) == {"t1", "t2"}
    things.gate.set()


async def test_a_renewal_renews_the_work_here_and_tells_the_tenant_then_expired_work_is_taken_over() -> None:
    things = tenancy()
    await things.start("t1")
    things.store.stale = ["t1", "gone"]  # t1 still runs here: its renewal was late, not its owner gone
    things.host.start()
    await asyncio.sleep(0.05)
    assert things.store.renewals[0] == ["t1"]
    assert things.renewed[0] == ["t1"]
    assert things.taken == ["gone"]
    things.gate.set()
    await things.host.close(lambda work: None, end_within=1)


async def test_stop_prepares_and_cancels_only_work_here() -> None:
    things = tenancy()
    await things.start("t1")
    live = things.host.get("t1")
    assert live is not None
    assert not await things.host.stop("elsewhere")
    assert await things.host.stop("t1", lambda work: setattr(work, "stopped_for", "a reason"))
    assert live.work.stopped_for == "a reason" and live.task.cancelled()
    assert things.host.get("t1") is None  # its task ended, and with it its registration


async def test_close_stops_everything_refuses_new_work_and_says_what_it_held() -> None:
    things = tenancy()
    await things.start("t1")
    await things.start("t2")
    prepared: list[str] = []
    held = await things.host.close(lambda work: prepared.append(work.key), end_within=1)
    assert sorted(held) == sorted(prepared) == ["t1", "t2"]
    with pytest.raises(Unavailable) as refused:
        await things.start("t3")
    assert refused.value.reason is ErrorReason.SHUTTING_DOWN


async def test_a_stream_starts_from_a_sequence_number_the_work_has() -> None:
    things = tenancy()
    things.store.records["t1"] = Record("t1", "a", last_sequence_no=3)

    async def get(key: str) -> Record:
        return things.store.records[key]

    with pytest.raises(InvalidArgument, match="must not be negative"):
        await things.host.events("t1", -1, get)
    with pytest.raises(InvalidArgument, match="the thing's newest event is 3"):
        await things.host.events("t1", 4, get)
