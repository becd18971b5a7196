"""The SQL every tenant of the host shares, parameterised by the tenant's tables.

A tenant keeps one row per piece of work (its state, its request id and digest, its lease: owner
and heartbeat time, and its event counter) and a numbered event log keyed by the same id. Reading
the log, the leases, the start by request id and the newest-first pages are the same SQL for runs
and campaigns; what their rows mean, and how events are written, stays with each tenant's store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from quarry import ids
from quarry.db import Database
from quarry.errors import AlreadyExists, ErrorReason, FieldViolation, InvalidArgument
from supervisor_svc.hosting.listing import decode_page_token, encode_page_token

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# A released lease: older than any lease, so the next sweep of any replica takes the work over.
RELEASED = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class StoredEvent:
    sequence_no: int
    payload: bytes
    terminal: bool


class _State(Protocol):
    @property
    def ended(self) -> bool: ...


class WorkRecord(Protocol):
    """What the host reads of a tenant's record."""

    @property
    def state(self) -> _State: ...

    @property
    def last_sequence_no(self) -> int: ...


class Asked(Protocol):
    """What a start asked for, as far as its request id goes: a reused request id must ask the same."""

    def digest(self) -> str: ...


R = TypeVar("R", bound=WorkRecord)


@dataclass(frozen=True)
class WorkTables:
    """A tenant's tables: `work` has a row per piece of work, `events` its numbered event log."""

    work: sa.Table
    events: sa.Table
    key: str  # the id column both tables share ("run_id", "campaign_id")
    live_states: tuple[str, ...]  # the states whose lease is kept; the others have ended (or wait for a human)
    noun: str  # "run", "campaign": what errors call one piece of work

    @property
    def id(self) -> sa.Column[Any]:
        return self.work.c[self.key]

    def live(self, key: str) -> sa.ColumnElement[bool]:
        return sa.and_(self.id == key, self.work.c.state.in_(self.live_states))

    def held(self, owner: str, keys: Sequence[str]) -> sa.ColumnElement[bool]:
        """The live work among `keys` that `owner` holds."""
        return sa.and_(self.work.c.owner == owner, self.id.in_(keys), self.work.c.state.in_(self.live_states))


class HostedStore(Generic[R]):
    """The shared part of a tenant's store; `record` turns one of its rows into its record."""

    def __init__(self, database: Database, tables: WorkTables, record: Callable[[sa.Row[Any]], R]) -> None:
        self._db = database
        self._tables = tables
        self._record = record

    # -- records -----------------------------------------------------------------------------------

    async def get(self, key: str, /) -> R | None:
        work = self._tables.work

        def read(connection: Connection) -> R | None:
            row = connection.execute(sa.select(work).where(self._tables.id == key)).first()
            return self._record(row) if row is not None else None

        return await self._db.read_statement(read)

    async def by_request_id(self, request_id: str, asked: Asked) -> R | None:
        """The work a request_id started, if any; ALREADY_EXISTS when it asked for something else."""
        work = self._tables.work

        def read(connection: Connection) -> tuple[R, str, str] | None:
            row = connection.execute(sa.select(work).where(work.c.request_id == request_id)).first()
            return (self._record(row), row.request_digest, row._mapping[self._tables.key]) if row is not None else None

        found = await self._db.read(read)
        if found is None:
            return None
        record, digest, key = found
        if digest != asked.digest():
            noun = self._tables.noun
            raise AlreadyExists(
                f"request_id {request_id!r} already started a different {noun}",
                reason=ErrorReason.REQUEST_ID_REUSED,
                metadata={self._tables.key: key},
            )
        return record

    async def _insert(self, row: dict[str, Any], request_id: str, asked: Asked) -> tuple[R, bool]:
        """Insert the row of new work; with a request_id seen before, the work it started (created=False)."""
        work = self._tables.work
        try:
            await self._db.write(lambda connection: connection.execute(work.insert().values(row)))
        except IntegrityError:
            existing = await self.by_request_id(request_id, asked) if request_id else None
            if existing is None:
                raise
            return existing, False
        record = await self.get(row[self._tables.key])
        assert record is not None
        return record, True

    async def _page(
        self, page_size: int, page_token: str, state: str, key_rule: ids.IdRule, method: str
    ) -> tuple[list[R], str]:
        """Newest first; the token carries the filter (`state`, "" for all), so a page cannot silently change
        what it lists."""
        if page_size < 0:
            raise InvalidArgument([FieldViolation("page_size", "must not be negative")])
        limit = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        work, key = self._tables.work, self._tables.id
        query = sa.select(work).order_by(work.c.create_time.desc(), key.desc()).limit(limit + 1)
        if state:
            query = query.where(work.c.state == state)
        if page_token:
            when, after = decode_page_token(page_token, state, key_rule, method)
            query = query.where(sa.or_(work.c.create_time < when, sa.and_(work.c.create_time == when, key < after)))

        def read(connection: Connection) -> list[sa.Row[Any]]:
            return list(connection.execute(query))

        found = await self._db.read_statement(read)
        page = found[:limit]
        last = page[-1] if len(found) > limit else None
        token = encode_page_token(state, last.create_time, last._mapping[self._tables.key]) if last is not None else ""
        return [self._record(row) for row in page], token

    # -- the event log -----------------------------------------------------------------------------

    async def events_after(self, key: str, after: int, limit: int = 500) -> list[StoredEvent]:
        events = self._tables.events
        query = (
            sa.select(events.c.sequence_no, events.c.payload, events.c.terminal)
            .where(events.c[self._tables.key] == key, events.c.sequence_no > after)
            .order_by(events.c.sequence_no)
            .limit(limit)
        )

        def read(connection: Connection) -> list[StoredEvent]:
            return [StoredEvent(row.sequence_no, bytes(row.payload), row.terminal) for row in connection.execute(query)]

        return await self._db.read_statement(read)

    async def all_events(self, key: str) -> list[StoredEvent]:
        """Every event of the work, in order (read a page at a time)."""
        found: list[StoredEvent] = []
        while page := await self.events_after(key, found[-1].sequence_no if found else 0):
            found.extend(page)
        return found

    # -- leases ------------------------------------------------------------------------------------

    async def renew(self, owner: str, keys: Sequence[str], now: datetime) -> None:
        """Renew the lease on the live work `owner` still holds (work whose task is gone is left to expire)."""
        await self._renew(owner, keys, now)

    async def _renew(self, owner: str, keys: Sequence[str], now: datetime) -> int:
        """How many of the leases it renewed."""
        mine = self._tables.held(owner, keys)
        work = self._tables.work
        return await self._db.write(
            lambda connection: connection.execute(work.update().where(mine).values(heartbeat_time=now)).rowcount
        )

    async def held(self, owner: str, keys: Sequence[str]) -> set[str]:
        """Those of `keys` that are live and still `owner`'s (the rest ended, were paused or were taken over)."""
        query = sa.select(self._tables.id).where(self._tables.held(owner, keys))
        return await self._db.read(lambda connection: {row[0] for row in connection.execute(query)})

    async def expired(self, stale_before: datetime) -> list[str]:
        """Live work whose owner stopped renewing the lease before `stale_before`."""
        work = self._tables.work
        query = sa.select(self._tables.id).where(
            work.c.state.in_(self._tables.live_states), work.c.heartbeat_time < stale_before
        )
        return await self._db.read(lambda connection: [row[0] for row in connection.execute(query)])

    async def reclaim(self, key: str, owner: str) -> bool:
        """Renew `owner`'s lease on live work it still holds, now; False when another process took it over
        meanwhile (or it ended). What work that waited out a database outage asks before it goes on."""
        return await self._renew(owner, [key], datetime.now(UTC)) == 1

    async def take_over(self, key: str, owner: str, stale_before: datetime) -> bool:
        """Make `owner` the holder of live work whose lease expired before `stale_before`; False when another
        replica got there first, or it is no longer live or expired."""
        work = self._tables.work
        stale = sa.and_(self._tables.live(key), work.c.heartbeat_time < stale_before)
        now = datetime.now(UTC)

        def write(connection: Connection) -> bool:
            return bool(connection.execute(work.update().where(stale).values(owner=owner, heartbeat_time=now)).rowcount)

        return await self._db.write(write)

    async def release(self, owner: str, keys: Sequence[str]) -> None:
        """Give up the leases of work `owner` stops doing (it shuts down): any replica takes it over at its
        next sweep."""
        mine = self._tables.held(owner, keys)
        work = self._tables.work
        await self._db.write(
            lambda connection: connection.execute(work.update().where(mine).values(heartbeat_time=RELEASED))
        )
