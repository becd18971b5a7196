"""SQL access for threads and entries: SQLAlchemy Core, each unit of work one transaction (in a database thread, or
on PostgreSQL an append's single statement on a connection the event loop owns)."""

from __future__ import annotations

import contextvars
import dataclasses
import json
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from quarry.db import Database, Prepared
from quarry.errors import AlreadyExists, ErrorReason, NotFound, QuarryError
from quarry.identity import Principal, Role
from quarry.notify import notify_on_commit, pg_notify
from quarry.vocabulary import Entry, EntryKind, Source
from scratchpad_svc.feed import Committed, Payloads
from scratchpad_svc.schema import entries, threads
from scratchpad_svc.threads import AppendCommand, AppendResult, NewThread, Thread

# Channel for cross-replica commit notifications on PostgreSQL.
NOTIFY_CHANNEL = "quarry_scratchpad_commits"


@dataclass(frozen=True)
class BatchOutcome:
    """One transaction's results, in request order (an item is an error when its request_id was reused),
    and the entries it created, numbered on from the thread's previous last."""

    results: list[AppendResult | QuarryError]
    last_sequence_no: int
    created: tuple[Entry, ...]

    def committed(self) -> Committed | None:
        """What watchers are handed; None when the batch created nothing."""
        if not self.created:
            return None
        return Committed(last=self.last_sequence_no, count=len(self.created), entries=self.created)


# The related entries a ledger check reads, at most: a thread's resolutions (one per objection) or the
# assignments whose content names a delegation.
_MAX_RELATED = 1000


@dataclass(frozen=True)
class LedgerView:
    """A thread as a ledger record's checks see it (ScratchpadStore.ledger_view)."""

    retry: bool = False
    kinds: dict[int, EntryKind] = field(default_factory=dict)
    related: list[tuple[int, str]] = field(default_factory=list)  # (sequence number, content)


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


def _same_thread_request(request: NewThread, thread: Thread) -> bool:
    """Whether a CreateThread retry asks for the thread its request_id already made."""
    return (
        request.thread_id in ("", thread.thread_id)
        and request.title == thread.title
        and dict(request.labels) == thread.labels
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
        reason=ErrorReason.REQUEST_ID_REUSED,
        metadata={"request_id": command.request_id, "sequence_no": str(original.sequence_no)},
    )


# One statement, one round trip, one implicit transaction: lock and advance the
# counter, insert the batch numbered from it, and notify other replicas on commit
# with the entries (their numbers follow from the counter, spliced into the payload).
# The counter row lock orders concurrent writers, so sequence numbers follow
# commit order with no gaps.
_COUNTER = (
    sa.text(
        """
        UPDATE scratchpad_threads SET last_sequence_no = last_sequence_no + :n
        WHERE thread_id = :thread_id
        RETURNING last_sequence_no
        """
    )
    .columns(sa.column("last_sequence_no", sa.BigInteger))
    .cte("counter")
)
_INSERTED = (
    sa.text(
        """
        INSERT INTO scratchpad_entries (thread_id, sequence_no, request_id, fingerprint, kind,
                                        author_id, author_role, content, sources, create_time)
        SELECT :thread_id, counter.last_sequence_no - :n + batch.position, batch.e->>0, batch.e->>1,
               batch.e->>2, batch.e->>3, batch.e->>4, batch.e->>5, batch.e->6, :create_time
        FROM counter, jsonb_array_elements(CAST(:rows AS jsonb)) WITH ORDINALITY AS batch(e, position)
        """
    )
    .columns()
    .cte("inserted")
)
# The fields of each row in the append's JSON parameter, in the order the statement reads them (batch.e->>0...).
_ROW_COLUMNS = ("request_id", "fingerprint", "kind", "author_id", "author_role", "content", "sources")
_POSTGRES_APPEND = Prepared(
    sa.select(
        _COUNTER.c.last_sequence_no,
        pg_notify(
            NOTIFY_CHANNEL,
            sa.bindparam("notify_head", type_=sa.String)
            + sa.cast(_COUNTER.c.last_sequence_no, sa.String)
            + sa.bindparam("notify_tail", type_=sa.String),
        ),
    )
    .select_from(_COUNTER)
    .add_cte(_COUNTER, _INSERTED)  # in this order: the insert reads the counter
)


# The SQLite append, prepared once: two statements in one transaction.
_RESERVE = Prepared(
    threads.update()
    .where(threads.c.thread_id == sa.bindparam("key"))
    .values(last_sequence_no=threads.c.last_sequence_no + sa.bindparam("count", type_=sa.BigInteger))
    .returning(threads.c.last_sequence_no)
)
_INSERT_ENTRIES = Prepared(entries.insert(), columns=[column.name for column in entries.c])


def _entry_row(entry: Entry, fingerprint: str) -> dict[str, Any]:
    return {
        "thread_id": entry.thread_id,
        "sequence_no": entry.sequence_no,
        "request_id": entry.request_id,
        "fingerprint": fingerprint,
        "kind": entry.kind.value,
        "author_id": entry.author.principal_id,
        "author_role": entry.author.role.value,
        "content": entry.content,
        "sources": [{"url": s.url, "title": s.title, "excerpt": s.excerpt} for s in entry.sources],
        "create_time": entry.create_time,
    }


def _new_entries(
    thread_id: str, commands: Sequence[AppendCommand], first_sequence_no: int
) -> dict[str, tuple[str, Entry]]:
    """The entries a batch creates, by request_id, with their payload fingerprints."""
    now = datetime.now(UTC)
    created: dict[str, tuple[str, Entry]] = {}
    for offset, command in enumerate(commands):
        assert command.kind is not None and command.role is not None  # validated before batching
        created[command.request_id] = (
            command.fingerprint(),
            Entry(
                thread_id=thread_id,
                sequence_no=first_sequence_no + offset,
                request_id=command.request_id,
                kind=command.kind,
                author=Principal(command.author_id, command.role),
                content=command.content,
                sources=command.sources,
                create_time=now,
            ),
        )
    return created


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
    numbered = tuple(entry for _, entry in created.values())  # in sequence order, ending at `last`
    return BatchOutcome(results=results, last_sequence_no=last, created=numbered)


async def notify_scope(database: Database) -> str:
    """The PostgreSQL schema the scratchpad's tables are in (what its NOTIFYs are about); "" elsewhere."""
    if not database.is_postgres:
        return ""
    return str(await database.read(lambda connection: connection.execute(sa.select(sa.func.current_schema())).scalar()))


class ScratchpadStore:
    """Async facade; each method's SQL runs as one transaction (see the module's docstring for where)."""

    def __init__(self, database: Database, payloads: Payloads | None = None) -> None:
        self._db = database
        self.payloads = payloads or Payloads(scope="", origin=uuid.uuid4().hex)
        # append_batch commits before it yields to the event loop (SQLite's inline writes).
        self.commits_without_yielding = database.writes_inline and not database.is_postgres

    async def create_thread(self, request: NewThread) -> Thread:
        thread = Thread(
            thread_id=request.thread_id or str(uuid.uuid4()),
            title=request.title,
            labels=dict(request.labels),
            create_time=datetime.now(UTC),
            last_sequence_no=0,
        )
        row = {
            "thread_id": thread.thread_id,
            "title": thread.title,
            "labels": thread.labels,
            "create_time": thread.create_time,
            "last_sequence_no": 0,
            "request_id": request.request_id or None,
        }
        try:
            await self._db.write(lambda connection: connection.execute(threads.insert().values(row)))
        except IntegrityError:
            # The request_id or the chosen thread_id exists: a retry, or a clash.
            existing = await self._db.read(lambda c: self._find_thread(c, request.request_id, thread.thread_id))
            if existing is None:
                raise
            if request.request_id and existing.request_id == request.request_id:
                original = _thread(existing)
                if _same_thread_request(request, original):
                    return original
                raise AlreadyExists(
                    f"request_id {request.request_id!r} already created thread {original.thread_id!r} "
                    "with other fields",
                    reason=ErrorReason.REQUEST_ID_REUSED,
                    metadata={"request_id": request.request_id, "thread_id": original.thread_id},
                ) from None
            raise AlreadyExists(
                f"thread {thread.thread_id!r} already exists",
                reason=ErrorReason.THREAD_EXISTS,
                metadata={"thread_id": thread.thread_id},
            ) from None
        return thread

    @staticmethod
    def _find_thread(connection: Connection, request_id: str, thread_id: str) -> sa.Row[Any] | None:
        condition = threads.c.thread_id == thread_id
        if request_id:
            condition = sa.or_(threads.c.request_id == request_id, condition)
        rows = list(connection.execute(sa.select(threads).where(condition)).all())
        rows.sort(key=lambda row: row.request_id != request_id)  # the thread the request_id made first
        return rows[0] if rows else None

    async def get_thread(self, thread_id: str) -> Thread:
        def work(connection: Connection) -> Thread:
            row = connection.execute(sa.select(threads).where(threads.c.thread_id == thread_id)).first()
            if row is None:
                raise NotFound("thread", thread_id, field="thread_id")
            return _thread(row)

        return await self._db.read(work)

    async def read(
        self, thread_id: str, after_sequence_no: int, limit: int, kinds: Sequence[EntryKind] | None = None
    ) -> tuple[list[Entry], int]:
        """Committed entries after a sequence number, and the thread's last sequence number.

        Entries are bounded by the counter read in the same snapshot; the counter and
        the entries up to it commit together, so a reader resuming after the last
        entry it saw never skips one that commits later.
        """

        join = [
            entries.c.thread_id == threads.c.thread_id,
            entries.c.sequence_no > after_sequence_no,
            entries.c.sequence_no <= threads.c.last_sequence_no,
        ]
        if kinds is not None:  # None: every kind; an empty filter matches nothing
            join.append(entries.c.kind.in_([kind.value for kind in kinds]))
        # One statement: the counter and the entries it bounds come from one snapshot.
        query = (
            sa.select(threads.c.last_sequence_no.label("thread_last_sequence_no"), *entries.c)
            .select_from(threads.outerjoin(entries, sa.and_(*join)))
            .where(threads.c.thread_id == thread_id)
            .order_by(entries.c.sequence_no)
            .limit(limit)
        )

        def work(connection: Connection) -> tuple[list[Entry], int]:
            rows = connection.execute(query).all()
            if not rows:
                raise NotFound("thread", thread_id, field="thread_id")
            return [_entry(row) for row in rows if row.sequence_no is not None], rows[0].thread_last_sequence_no

        return await self._db.read_statement(work)

    async def ledger_view(
        self, thread_id: str, request_id: str, numbers: Collection[int], kind: EntryKind | None, containing: str
    ) -> LedgerView:
        """What checking a ledger record against its thread needs, in one snapshot: whether `request_id` was
        taken already (a retry, which the append answers from the store), the kinds of the entries `numbers`,
        and the content of the entries of `kind` whose content contains `containing`."""

        def work(connection: Connection) -> LedgerView:
            if connection.execute(
                sa.select(entries.c.sequence_no).where(
                    entries.c.thread_id == thread_id, entries.c.request_id == request_id
                )
            ).first():
                return LedgerView(retry=True)
            found = connection.execute(
                sa.select(entries.c.sequence_no, entries.c.kind).where(
                    entries.c.thread_id == thread_id, entries.c.sequence_no.in_(sorted(numbers))
                )
            ).all()
            related: list[tuple[int, str]] = []
            if kind is not None:
                related = [
                    (int(row.sequence_no), str(row.content))
                    for row in connection.execute(
                        sa.select(entries.c.sequence_no, entries.c.content)
                        .where(
                            entries.c.thread_id == thread_id,
                            entries.c.kind == kind.value,
                            entries.c.content.contains(containing, autoescape=True),
                        )
                        .order_by(entries.c.sequence_no)
                        .limit(_MAX_RELATED)
                    )
                ]
            return LedgerView(kinds={int(row.sequence_no): EntryKind(row.kind) for row in found}, related=related)

        return await self._db.read(work)

    async def append_batch(
        self, thread_id: str, commands: Sequence[AppendCommand], *, context: contextvars.Context | None = None
    ) -> BatchOutcome:
        """Commit a batch of appends to one thread in one transaction, in `context` (the caller's if None).

        The fast path assumes every request_id is new: it advances the counter and
        inserts. If a request_id already exists the unique constraint rejects the
        insert, the transaction rolls back, and the careful path resolves replays.
        """
        unique = _first_per_request_id(commands)
        try:
            if self._db.is_postgres:
                return await self._append_new_postgres(thread_id, commands, unique, context)
            return await self._db.write(lambda c: self._append_new(c, thread_id, commands, unique), context=context)
        except IntegrityError:
            return await self._db.write(
                lambda c: self._append_resolving(c, thread_id, commands),
                context=context,
            )

    @staticmethod
    def _append_new(
        connection: Connection, thread_id: str, commands: Sequence[AppendCommand], unique: list[AppendCommand]
    ) -> BatchOutcome:
        reserved = _RESERVE.execute(connection, {"key": thread_id, "count": len(unique)}).fetchone()
        if reserved is None:
            raise NotFound("thread", thread_id, field="thread_id")
        first = int(reserved[0]) - len(unique) + 1
        created = _new_entries(thread_id, unique, first_sequence_no=first)
        _INSERT_ENTRIES.execute(connection, [_entry_row(entry, fp) for fp, entry in created.values()])
        last = first + len(unique) - 1
        return _outcome(commands, created, {}, last)

    async def _append_new_postgres(
        self,
        thread_id: str,
        commands: Sequence[AppendCommand],
        unique: list[AppendCommand],
        context: contextvars.Context | None,
    ) -> BatchOutcome:
        created = _new_entries(thread_id, unique, first_sequence_no=1)  # renumbered below
        rows = [_entry_row(entry, fp) for fp, entry in created.values()]
        head, tail = self.payloads.parts(thread_id, [entry for _, entry in created.values()])
        result = await self._db.write_statement(
            _POSTGRES_APPEND,
            {
                "notify_head": head,
                "notify_tail": tail,
                "thread_id": thread_id,
                "n": len(rows),
                "create_time": rows[0]["create_time"],
                # One JSON document, not an array per column: the driver dumps one string instead of
                # eight arrays, element by element (measured: less CPU per append on the event loop).
                "rows": json.dumps(
                    [[row[column] for column in _ROW_COLUMNS] for row in rows],
                    ensure_ascii=False,
                ),
            },
            context=context,
        )
        if result is None:  # no counter row, so nothing inserted or notified
            raise NotFound("thread", thread_id, field="thread_id")
        last = result[0]
        first = last - len(rows) + 1
        renumbered = {
            request_id: (fp, dataclasses.replace(entry, sequence_no=first + index))
            for index, (request_id, (fp, entry)) in enumerate(created.items())
        }
        return _outcome(commands, renumbered, {}, last)

    def _append_resolving(
        self, connection: Connection, thread_id: str, commands: Sequence[AppendCommand]
    ) -> BatchOutcome:
        last = connection.execute(
            sa.select(threads.c.last_sequence_no).where(threads.c.thread_id == thread_id).with_for_update()
        ).scalar()
        if last is None:
            raise NotFound("thread", thread_id, field="thread_id")
        request_ids = list({command.request_id for command in commands})
        rows = connection.execute(
            sa.select(entries).where(entries.c.thread_id == thread_id, entries.c.request_id.in_(request_ids))
        ).all()
        existing = {row.request_id: (row.fingerprint, _entry(row)) for row in rows}
        fresh = _first_per_request_id([c for c in commands if c.request_id not in existing])
        created = _new_entries(thread_id, fresh, first_sequence_no=last + 1)
        if created:
            connection.execute(entries.insert(), [_entry_row(entry, fp) for fp, entry in created.values()])
            last += len(created)
            connection.execute(threads.update().where(threads.c.thread_id == thread_id).values(last_sequence_no=last))
            payload = self.payloads.payload(thread_id, [entry for _, entry in created.values()], last)
            notify_on_commit(connection, NOTIFY_CHANNEL, payload)
        return _outcome(commands, created, existing, last)
