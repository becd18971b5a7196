"""SQL access for threads and entries (SQLAlchemy Core, async)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from quarry.db import is_postgres, run_in_transaction
from quarry.errors import AlreadyExists, NotFound, QuarryError
from quarry.identity import Principal, Role
from scratchpad_svc.model import AppendCommand, AppendResult, Entry, EntryKind, NewThread, Source, Thread
from scratchpad_svc.schema import entries, threads

# Channel for cross-replica commit notifications on PostgreSQL.
NOTIFY_CHANNEL = "quarry_scratchpad_commits"


@dataclass(frozen=True)
class BatchOutcome:
    """One transaction's results, in request order; an item is an error when its request_id was reused."""

    results: list[AppendResult | QuarryError]
    last_sequence_no: int


def _thread(row: sa.Row[Any]) -> Thread:
    return Thread(
        thread_id=row.thread_id,
        title=row.title,
        labels=dict(row.labels),
        create_time=row.create_time,
        last_sequence_no=row.last_sequence_no,
    )


def _entry(row: sa.Row[Any]) -> Entry:
    return Entry(
        thread_id=row.thread_id,
        sequence_no=row.sequence_no,
        request_id=row.request_id,
        kind=EntryKind(row.kind),
        author=Principal(principal_id=row.author_id, role=Role(row.author_role)),
        content=row.content,
        sources=tuple(Source(url=s["url"], title=s["title"], excerpt=s["excerpt"]) for s in row.sources),
        create_time=row.create_time,
    )


def _first_per_request_id(commands: Sequence[AppendCommand]) -> list[AppendCommand]:
    """The commands that create entries: the first of each request_id, in request order."""
    first: dict[str, AppendCommand] = {}
    for command in commands:
        first.setdefault(command.request_id, command)
    return list(first.values())


def _request_reused(command: AppendCommand, original: Entry) -> AlreadyExists:
    return AlreadyExists(
        f"request_id {command.request_id!r} was already used on this thread for a different entry "
        f"(sequence_no {original.sequence_no})",
        reason="REQUEST_ID_REUSED",
        metadata={"request_id": command.request_id, "sequence_no": str(original.sequence_no)},
    )


class ScratchpadStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._notify = is_postgres(engine)

    async def create_thread(self, request: NewThread) -> Thread:
        thread_id = request.thread_id or str(uuid.uuid4())
        row: dict[str, Any] = {
            "thread_id": thread_id,
            "title": request.title,
            "labels": dict(request.labels),
            "create_time": datetime.now(UTC),
            "last_sequence_no": 0,
            "request_id": request.request_id or None,
        }

        async def insert(connection: AsyncConnection) -> None:
            await connection.execute(threads.insert().values(row))

        try:
            await run_in_transaction(self._engine, insert, write=True)
        except IntegrityError:
            # Either the request_id or the chosen thread_id exists: a retry, or a clash.
            existing = await self._find_thread(request.request_id, thread_id)
            if existing is None:
                raise
            if request.request_id and existing.request_id == request.request_id:
                return existing.thread
            raise AlreadyExists(
                f"thread {thread_id!r} already exists", reason="THREAD_EXISTS", metadata={"thread_id": thread_id}
            ) from None
        return Thread(
            thread_id=thread_id,
            title=request.title,
            labels=dict(request.labels),
            create_time=row["create_time"],
            last_sequence_no=0,
        )

    @dataclass(frozen=True)
    class _Found:
        thread: Thread
        request_id: str | None

    async def _find_thread(self, request_id: str, thread_id: str) -> _Found | None:
        condition = threads.c.thread_id == thread_id
        if request_id:
            condition = sa.or_(threads.c.request_id == request_id, condition)
        async with self._engine.connect() as connection:
            rows = list((await connection.execute(sa.select(threads).where(condition))).all())
        # Prefer the thread the request_id created.
        rows.sort(key=lambda r: r.request_id != request_id)
        return self._Found(_thread(rows[0]), rows[0].request_id) if rows else None

    async def get_thread(self, thread_id: str) -> Thread:
        async with self._engine.connect() as connection:
            row = (await connection.execute(sa.select(threads).where(threads.c.thread_id == thread_id))).first()
        if row is None:
            raise NotFound("thread", thread_id, field="thread_id")
        return _thread(row)

    async def read(
        self, thread_id: str, after_sequence_no: int, limit: int, kinds: Sequence[EntryKind] = ()
    ) -> tuple[list[Entry], int]:
        """Committed entries after a sequence number, and the thread's last sequence number.

        Entries are bounded by the counter read first: the counter and the entries
        up to it commit together, so the page never skips an entry that commits later.
        """

        async def work(connection: AsyncConnection) -> tuple[list[Entry], int]:
            last = (
                await connection.execute(sa.select(threads.c.last_sequence_no).where(threads.c.thread_id == thread_id))
            ).scalar()
            if last is None:
                raise NotFound("thread", thread_id, field="thread_id")
            if last <= after_sequence_no:
                return [], last
            query = (
                sa.select(entries)
                .where(
                    entries.c.thread_id == thread_id,
                    entries.c.sequence_no > after_sequence_no,
                    entries.c.sequence_no <= last,
                )
                .order_by(entries.c.sequence_no)
                .limit(limit)
            )
            if kinds:
                query = query.where(entries.c.kind.in_([kind.value for kind in kinds]))
            rows = (await connection.execute(query)).all()
            return [_entry(row) for row in rows], last

        return await run_in_transaction(self._engine, work, write=False)

    async def append_batch(self, thread_id: str, commands: Sequence[AppendCommand]) -> BatchOutcome:
        """Commit a batch of appends to one thread in one transaction.

        The fast path assumes every request_id is new: it advances the counter and
        inserts. If a request_id already exists the unique constraint rejects the
        insert, the transaction rolls back, and the careful path resolves replays.
        """
        unique = _first_per_request_id(commands)
        try:
            return await run_in_transaction(
                self._engine, lambda c: self._append_new(c, thread_id, commands, unique), write=True
            )
        except IntegrityError:
            return await run_in_transaction(
                self._engine, lambda c: self._append_resolving(c, thread_id, commands), write=True
            )

    async def _append_new(
        self,
        connection: AsyncConnection,
        thread_id: str,
        commands: Sequence[AppendCommand],
        unique: list[AppendCommand],
    ) -> BatchOutcome:
        last = (
            await connection.execute(
                threads.update()
                .where(threads.c.thread_id == thread_id)
                .values(last_sequence_no=threads.c.last_sequence_no + len(unique))
                .returning(threads.c.last_sequence_no)
            )
        ).scalar()
        if last is None:
            raise NotFound("thread", thread_id, field="thread_id")
        created = await self._insert(connection, thread_id, unique, first_sequence_no=last - len(unique) + 1)
        return self._outcome(commands, created, {}, last)

    async def _append_resolving(
        self, connection: AsyncConnection, thread_id: str, commands: Sequence[AppendCommand]
    ) -> BatchOutcome:
        last = (
            await connection.execute(
                sa.select(threads.c.last_sequence_no).where(threads.c.thread_id == thread_id).with_for_update()
            )
        ).scalar()
        if last is None:
            raise NotFound("thread", thread_id, field="thread_id")
        request_ids = list({command.request_id for command in commands})
        rows = (
            await connection.execute(
                sa.select(entries).where(entries.c.thread_id == thread_id, entries.c.request_id.in_(request_ids))
            )
        ).all()
        existing = {row.request_id: (row.fingerprint, _entry(row)) for row in rows}
        fresh = _first_per_request_id([c for c in commands if c.request_id not in existing])
        created = await self._insert(connection, thread_id, fresh, first_sequence_no=last + 1)
        last += len(fresh)
        await connection.execute(threads.update().where(threads.c.thread_id == thread_id).values(last_sequence_no=last))
        return self._outcome(commands, created, existing, last)

    async def _insert(
        self, connection: AsyncConnection, thread_id: str, commands: list[AppendCommand], first_sequence_no: int
    ) -> dict[str, tuple[str, Entry]]:
        if not commands:
            return {}
        now = datetime.now(UTC)
        rows = []
        created: dict[str, tuple[str, Entry]] = {}
        for offset, command in enumerate(commands):
            assert command.kind is not None and command.role is not None  # validated before batching
            fingerprint = command.fingerprint()
            entry = Entry(
                thread_id=thread_id,
                sequence_no=first_sequence_no + offset,
                request_id=command.request_id,
                kind=command.kind,
                author=Principal(command.author_id, command.role),
                content=command.content,
                sources=command.sources,
                create_time=now,
            )
            created[command.request_id] = (fingerprint, entry)
            rows.append(
                {
                    "thread_id": thread_id,
                    "sequence_no": entry.sequence_no,
                    "request_id": entry.request_id,
                    "fingerprint": fingerprint,
                    "kind": entry.kind.value,
                    "author_id": entry.author.principal_id,
                    "author_role": entry.author.role.value,
                    "content": entry.content,
                    "sources": [{"url": s.url, "title": s.title, "excerpt": s.excerpt} for s in entry.sources],
                    "create_time": now,
                }
            )
        await connection.execute(entries.insert(), rows)
        if self._notify:
            await connection.execute(sa.select(sa.func.pg_notify(NOTIFY_CHANNEL, thread_id)))
        return created

    @staticmethod
    def _outcome(
        commands: Sequence[AppendCommand],
        created: dict[str, tuple[str, Entry]],
        existing: dict[str, tuple[str, Entry]],
        last: int,
    ) -> BatchOutcome:
        results: list[AppendResult | QuarryError] = []
        answered: set[str] = set()
        for command in commands:
            if command.request_id in existing:
                fingerprint, entry = existing[command.request_id]
                replayed = True
            else:
                fingerprint, entry = created[command.request_id]
                # The first command with a new request_id wrote it; later ones in the batch are retries.
                replayed = command.request_id in answered
            answered.add(command.request_id)
            if fingerprint != command.fingerprint():
                results.append(_request_reused(command, entry))
            else:
                results.append(AppendResult(entry=entry, replayed=replayed))
        return BatchOutcome(results=results, last_sequence_no=last)
