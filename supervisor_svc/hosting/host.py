"""The host of one kind of durable work (runs, campaigns) in one supervisor process.

Each piece of work this process does runs as an asyncio task, registered here by id. Its row carries
a lease (owner and heartbeat time): the host renews the leases of the work it still does, lets its
tenant act on what another replica changed at each renewal (a cancellation, a pause, a decision),
and has the tenant take over work whose owner stopped renewing (a run is ended as failed, a
campaign resumed here). Starts are de-duplicated by request id, in this process and in the store,
and admitted while this process has room and is not shutting down. What a piece of work does,
and what taking it over means, is the tenant's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from quarry.errors import ErrorReason, FieldViolation, InvalidArgument, ResourceExhausted, Unavailable
from quarry.lease import LeaseKeeper, LeaseStore, LeaseTerms
from quarry.notify import CommitSignal
from supervisor_svc.hosting.following import Follower, reattach_after
from supervisor_svc.hosting.store import Asked, HostedStore, R, StoredEvent

W = TypeVar("W")
_T = TypeVar("_T")

# How many other starts with the same request_id (asking something else) one call waits out.
_MAX_START_WAITS = 8


@dataclass(frozen=True)
class HostLimits:
    # Work this process does at once; beyond it a start answers RESOURCE_EXHAUSTED, and expired work is
    # left to other replicas.
    max_active: int
    # Work whose owner has not renewed its lease for this long is taken over (a run ended as failed, a
    # campaign resumed).
    lease_seconds: float = 30.0
    # Streams re-read this often without a local signal (events written by another replica).
    stream_poll_seconds: float = 1.0
    # How long a stop (CancelRun, a pause) waits for the work's task here to end (longer than a renewal
    # interval, so a stop taken by another replica is seen in time).
    stop_wait_seconds: float = 10.0


@dataclass(frozen=True)
class Tenant:
    """What a tenant tells its host."""

    kind: str  # "run", "campaign": for logs and the lease keeper
    owner_prefix: str  # this process's owner name starts so (it is stored with the work it holds)
    start_method: str  # "StartRun": for errors
    # The error when this process already does `max_active` pieces of work.
    at_capacity: Callable[[int], ResourceExhausted]
    # Takes over one expired piece of work; False when another replica got there first (or it cannot).
    take_over: Callable[[str], Awaitable[bool]]
    # Called after each renewal with the ids renewed: the tenant picks up what another replica changed.
    renewed: Callable[[Sequence[str]], Awaitable[None]]
    taken_over: str = "ended as failed"  # what take_over does, for the log


@dataclass(frozen=True)
class Live(Generic[W]):
    work: W
    task: asyncio.Task[None]


class _Leases:
    """The tenant's lease SQL as the keeper sees it: each renewal also hands the tenant what changed
    elsewhere, so it reaches the work within one renewal interval."""

    def __init__(self, store: LeaseStore, renewed: Callable[[Sequence[str]], Awaitable[None]]) -> None:
        self._store = store
        self._renewed = renewed

    async def renew(self, owner: str, ids: Sequence[str], now: datetime) -> None:
        await self._store.renew(owner, ids, now)
        await self._renewed(ids)

    async def expired(self, stale_before: datetime) -> list[str]:
        return await self._store.expired(stale_before)


class Host(Generic[W, R]):
    def __init__(
        self, tenant: Tenant, store: HostedStore[R], limits: HostLimits, signal: CommitSignal | None = None
    ) -> None:
        self._tenant = tenant
        self._store = store
        self.limits = limits
        self.bus = signal or CommitSignal()
        self.owner = f"{tenant.owner_prefix}-{uuid.uuid4().hex[:12]}"
        self._live: dict[str, Live[W]] = {}
        self._starting = 0
        # Starts under way by request_id (with the digest of what they ask): concurrent retries of one
        # request share its start, so they take one slot and get one piece of work.
        self._starts: dict[str, tuple[str, asyncio.Future[R]]] = {}
        self.closing = asyncio.Event()
        self._follower = Follower(self.bus, self.closing, limits.stream_poll_seconds)
        # Renewals often enough that a change taken by another replica reaches the work within seconds.
        self._leases = LeaseKeeper(
            tenant.kind,
            self.owner,
            _Leases(store, tenant.renewed),
            held=lambda: list(self._live),
            take_over=tenant.take_over,
            terms=LeaseTerms(limits.lease_seconds, max_interval_seconds=2.0),
            taken_over=tenant.taken_over,
        )

    def start(self) -> None:
        """Renew leases and take over expired work from now on."""
        self._leases.start()

    # -- starting ----------------------------------------------------------------------------------

    async def start_work(
        self,
        request_id: str,
        asked: Asked,
        create: Callable[[], Awaitable[R]],
        *,
        ready: Callable[[], None] = lambda: None,
    ) -> R:
        """The work a start asks for: with a request_id seen before, the work it started (whatever the load
        now); else, once `ready` has not raised and there is room, `create`'s (which inserts and launches it).
        Concurrent starts with one request_id share one start."""
        if not request_id:
            return await self._start(request_id, asked, create, ready)
        digest = asked.digest()
        for _ in range(_MAX_START_WAITS):
            under_way = self._starts.get(request_id)
            if under_way is None or under_way[1].done():
                break
            known, start = under_way
            if known == digest:
                return await asyncio.shield(start)  # the same request, already being started: its outcome
            # Another request with this request_id is being started: once it has, the store says whose it is.
            await asyncio.wait([start])
        else:
            raise Unavailable(f"other {self._tenant.start_method}s with request_id {request_id!r} keep arriving; retry")
        # A task of its own: a caller that goes away does not abandon a start its retries may be waiting on.
        start = asyncio.ensure_future(self._start(request_id, asked, create, ready))
        entry = (digest, start)
        self._starts[request_id] = entry
        start.add_done_callback(lambda _: self._start_ended(request_id, entry))
        return await asyncio.shield(start)

    def _start_ended(self, request_id: str, entry: tuple[str, asyncio.Future[R]]) -> None:
        if self._starts.get(request_id) is entry:
            del self._starts[request_id]
        if not entry[1].cancelled():
            entry[1].exception()  # retrieved, though every caller may have gone

    async def _start(
        self, request_id: str, asked: Asked, create: Callable[[], Awaitable[R]], ready: Callable[[], None]
    ) -> R:
        if request_id:
            existing = await self._store.by_request_id(request_id, asked)
            if existing is not None:
                return existing
        ready()
        if self.closing.is_set():
            raise Unavailable("the supervisor is shutting down; retry", reason=ErrorReason.SHUTTING_DOWN)
        if not self.has_room():
            raise self._tenant.at_capacity(self.limits.max_active)
        self._starting += 1  # holds the slot across the awaits, so concurrent calls cannot overshoot
        try:
            # Shielded: once the row exists, its task must too, even if the caller goes away meanwhile.
            return await asyncio.shield(create())
        finally:
            self._starting -= 1

    def has_room(self) -> bool:
        """Whether this process may start (or take over) one more piece of work now."""
        return len(self._live) + self._starting < self.limits.max_active and not self.closing.is_set()

    def launch(self, key: str, work: W, run: Coroutine[Any, Any, None]) -> None:
        """Run `run` as the task of `work`, registered under `key` until it ends."""
        task = asyncio.create_task(run, name=key)
        self._live[key] = Live(work, task)
        task.add_done_callback(lambda done: self._ended(key, done))

    def _ended(self, key: str, task: asyncio.Task[None]) -> None:
        live = self._live.get(key)
        if live is not None and live.task is task:
            del self._live[key]

    # -- live work ---------------------------------------------------------------------------------

    def get(self, key: str) -> Live[W] | None:
        return self._live.get(key)

    def cancel(self, key: str, prepare: Callable[[W], None] | None = None) -> Live[W] | None:
        """Cancel the task of work done here after `prepare(work)`, unless it has ended; the work, if done here."""
        live = self._live.get(key)
        if live is not None and not live.task.done():
            if prepare is not None:
                prepare(live.work)
            live.task.cancel()
        return live

    async def stop(self, key: str, prepare: Callable[[W], None] | None = None) -> bool:
        """Cancel work done here and wait (`stop_wait_seconds` at most) for its task to end; False when it
        is not done here."""
        live = self.cancel(key, prepare)
        if live is None:
            return False
        await asyncio.wait([live.task], timeout=self.limits.stop_wait_seconds)
        return True

    async def events(
        self, key: str, after_sequence_no: int, get: Callable[[str], Awaitable[R]]
    ) -> AsyncIterator[StoredEvent]:
        """The work's events after `after_sequence_no`, in order, until the terminal one; waits for new ones.
        `get` reads the work's record (NOT_FOUND for an unknown id)."""
        if after_sequence_no < 0:
            raise InvalidArgument([FieldViolation("after_sequence_no", "must not be negative")])
        try:
            record = await get(key)
        except Unavailable as error:
            raise reattach_after(error, after_sequence_no) from error
        if after_sequence_no > record.last_sequence_no:
            newest = f"the {self._tenant.kind}'s newest event is {record.last_sequence_no}"
            raise InvalidArgument([FieldViolation("after_sequence_no", newest)])
        return self._follower.follow(self._store, key, after_sequence_no)

    async def close(self, prepare: Callable[[W], None], end_within: float | None) -> list[str]:
        """Refuse new work, end the streams, cancel every task here after `prepare(work)` and wait for them
        (`end_within` seconds at most; None: until they end), then stop renewing. The ids it held."""
        self.closing.set()
        held = list(self._live)
        for live in list(self._live.values()):
            prepare(live.work)
            live.task.cancel()
        if self._live:
            await asyncio.wait([live.task for live in self._live.values()], timeout=end_within)
        await self._leases.stop()
        return held
