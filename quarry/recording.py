"""A run's recording: every HTTP exchange its agents make (model calls, searches, fetched pages), kept in the
store of the service that made it, so that the run can be exported and replayed exactly.

Recording happens in one place, an httpx transport (`RecordingTransport`) that the model client and the
worker's web clients send through. It records only inside a run's scope (`recording(...)`, set where a run
or a delegation executes), and tees the response as it streams, so a model's tokens still arrive live.
Bodies are stored once by their SHA-256 (`recorded_blobs`); a chat request is stored as the hashes of its
messages and tools, so a message's text is stored once however many turns send it again.

The same transport answers from a recording instead of the network while a replay is installed
(`replaying(...)`): see `quarry.replay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from quarry.db import Database, json_type
from quarry.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

# How long a recorded exchange waits for its database to come back, as long as a run does by default.
_OUTAGE_WAIT_SECONDS = 600.0

# The scope of the exchanges a supervisor makes for a run; a worker's scope is the delegation's id.
SUPERVISOR_SCOPE = "supervisor"

metadata = sa.MetaData()

exchanges = sa.Table(
    "recorded_exchanges",
    metadata,
    sa.Column("exchange_id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    # Who made it: SUPERVISOR_SCOPE, or the delegation's id.
    sa.Column("scope", sa.String(256), nullable=False),
    # When the request was sent (seconds since the epoch): the order a replay serves exchanges in.
    sa.Column("sent_at", sa.Float, nullable=False),
    sa.Column("method", sa.String(16), nullable=False),
    sa.Column("url", sa.Text, nullable=False),
    # The request body as hashes (see `request_form`).
    sa.Column("request", json_type(), nullable=False),
    sa.Column("status", sa.Integer, nullable=False),
    # The response's headers as [name, value] pairs, as the reader got them (content-type,
    # content-encoding, a redirect's location): a replay answers with the same.
    sa.Column("headers", json_type(), nullable=False),
    sa.Column("body_sha256", sa.String(64), nullable=False),
    # False when the reader stopped before the body ended (a cancelled call): replayed as far as it went.
    sa.Column("complete", sa.Boolean, nullable=False),
    sa.Index("recorded_exchanges_by_run", "run_id", "sent_at"),
)

blobs = sa.Table(
    "recorded_blobs",
    metadata,
    sa.Column("sha256", sa.String(64), primary_key=True),
    sa.Column("body", sa.LargeBinary, nullable=False),
)


def add_recording_tables(service_metadata: sa.MetaData) -> None:
    """Adds the recording tables to a service's own MetaData, so that its migrations create them."""
    for table in metadata.tables.values():
        table.to_metadata(service_metadata)


def create_recording_tables(connection: Connection) -> None:
    """The recording tables, as the migration that adds them creates them (the supervisor's and the worker's).

    It creates them from the tables above: a later change to them must leave this creating what it creates
    now, and make its own migration."""
    metadata.create_all(connection)


def drop_recording_tables(connection: Connection) -> None:
    metadata.drop_all(connection)


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def canonical(value: Any) -> bytes:
    """One byte form per JSON value, whatever its key order: what a content hash is taken of."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def request_form(body: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The stored form of a request body, and the blobs it refers to.

    A chat request's messages and tools become lists of hashes (each message is a blob of its own, shared
    by every later turn that sends it again); its other fields are kept as they are. Any other body is one
    blob, or nothing when empty.
    """
    if not body:
        return {}, {}
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if not isinstance(document, dict) or not isinstance(document.get("messages"), list):
        return {"body": sha256(body)}, {sha256(body): body}
    stored: dict[str, bytes] = {}

    def blob(value: Any) -> str:
        data = canonical(value)
        digest = sha256(data)
        stored[digest] = data
        return digest

    form = {key: value for key, value in document.items() if key not in ("messages", "tools")}
    form["messages"] = [blob(message) for message in document["messages"]]
    if "tools" in document:
        form["tools"] = [blob(tool) for tool in document["tools"]]
    return form, stored


@dataclass(frozen=True)
class Exchange:
    """One recorded request and its answer."""

    run_id: str
    scope: str
    sent_at: float
    method: str
    url: str
    request: dict[str, Any]
    status: int
    headers: list[list[str]]
    body_sha256: str
    complete: bool

    def row(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _EXCHANGE_FIELDS}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Exchange:
        return cls(**{name: row[name] for name in _EXCHANGE_FIELDS})


_EXCHANGE_FIELDS = (
    "run_id",
    "scope",
    "sent_at",
    "method",
    "url",
    "request",
    "status",
    "headers",
    "body_sha256",
    "complete",
)


def _insert_blobs(connection: Connection, stored: Mapping[str, bytes]) -> None:
    if not stored:
        return
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    rows = [{"sha256": digest, "body": body} for digest, body in stored.items()]
    connection.execute(dialect.insert(blobs).on_conflict_do_nothing(index_elements=["sha256"]), rows)


class RecordingStore:
    """The recording tables of one service's database.

    An exchange is written beside the agent's next step rather than before it (`add_later`); reading a
    run's recording first waits for the writes this process still has under way for it."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._writes: dict[str, set[asyncio.Task[None]]] = {}

    async def add(self, exchange: Exchange, stored: Mapping[str, bytes]) -> None:
        def work(connection: Connection) -> None:
            _insert_blobs(connection, stored)
            connection.execute(exchanges.insert(), exchange.row())

        await self._db.write(work)

    def add_later(self, run_id: str, stored: Callable[[], tuple[Exchange, dict[str, bytes]]]) -> None:
        """Stores what `stored` makes (hashing a request is work too) in a task of its own."""
        writes = self._writes.setdefault(run_id, set())
        task = asyncio.ensure_future(self._add_logged(stored))
        writes.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            writes.discard(finished)
            if not writes and self._writes.get(run_id) is writes:
                del self._writes[run_id]

        task.add_done_callback(done)

    async def _add_logged(self, stored: Callable[[], tuple[Exchange, dict[str, bytes]]]) -> None:
        """Stores the exchange, waiting out an outage of the database as the run does (the outage itself is
        logged once, by the database); what still fails is logged, and the run goes on without it: its
        replay names the step its recording lacks."""
        exchange, bodies = stored()
        deadline = time.monotonic() + _OUTAGE_WAIT_SECONDS
        lost = "run %s: an exchange with %s was not recorded"
        for attempt in itertools.count():
            try:
                await self.add(exchange, bodies)
                return
            except DatabaseUnavailable as error:
                if time.monotonic() > deadline:
                    log.warning(lost + ": %s", exchange.run_id, exchange.url, error)
                    return
                await asyncio.sleep(min(5.0, 0.1 * 2**attempt))
            except Exception:
                log.warning(lost, exchange.run_id, exchange.url, exc_info=True)
                return

    async def read(self, run_id: str) -> tuple[list[Exchange], dict[str, bytes]]:
        """A run's exchanges in the order they were sent, and every blob they refer to."""
        while self._writes.get(run_id):
            await asyncio.gather(*self._writes[run_id], return_exceptions=True)

        def work(connection: Connection) -> tuple[list[Exchange], dict[str, bytes]]:
            rows = connection.execute(
                sa.select(exchanges)
                .where(exchanges.c.run_id == run_id)
                .order_by(exchanges.c.sent_at, exchanges.c.exchange_id)
            ).mappings()
            found = [Exchange.from_row(dict(row)) for row in rows]
            wanted = sorted({digest for exchange in found for digest in referenced_blobs(exchange)})
            bodies: dict[str, bytes] = {}
            for start in range(0, len(wanted), 500):  # bounded IN lists
                chunk = wanted[start : start + 500]
                for digest, body in connection.execute(sa.select(blobs).where(blobs.c.sha256.in_(chunk))):
                    bodies[digest] = bytes(body)
            return found, bodies

        return await self._db.read(work)


def referenced_blobs(exchange: Exchange) -> list[str]:
    request = exchange.request
    named = [request["body"]] if "body" in request else []
    return [*named, *request.get("messages", ()), *request.get("tools", ()), exchange.body_sha256]


class ReplayAnswers(Protocol):
    """Where a replay's requests are answered, and its scratchpad appends ordered: quarry.replay.ReplaySource."""

    async def answer(self, request: httpx.Request, body: bytes) -> httpx.Response: ...

    async def before_append(self, author: str, kind: str, content: str, preview: str) -> None:
        """Waits (a bounded time) until the entries recorded before this one are in; `preview` is what the run's
        stream shows of the entry (quarry.records.research.entry_preview)."""

    def appended(self, sequence_no: int) -> None: ...


@dataclass(frozen=True)
class Recordings:
    """A service's recordings: where they are kept, and the settings of its own that shape a run's answers
    (model names, search backend, limits), which its exports carry so that a replay is configured alike."""

    store: RecordingStore
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Recording:
    """The scope a run's exchanges are recorded under: which run, which of its agents, and where."""

    run_id: str
    scope: str
    store: RecordingStore


_CURRENT: contextvars.ContextVar[Recording | None] = contextvars.ContextVar("quarry_recording", default=None)
_REPLAY: contextvars.ContextVar[ReplayAnswers | None] = contextvars.ContextVar("quarry_replay", default=None)


@contextlib.contextmanager
def recording(run_id: str, scope: str, recordings: Recordings | None) -> Iterator[None]:
    """Records the HTTP exchanges made inside (and in tasks started inside) as this run's; None: not recorded."""
    token = _CURRENT.set(None if recordings is None else Recording(run_id, scope, recordings.store))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_run() -> str:
    """The run whose exchanges are recorded here, or "" outside a run."""
    current = _CURRENT.get()
    return "" if current is None else current.run_id


def current_scope() -> str:
    """Who is making requests here: the scope of the recording in force, or "" outside a run."""
    current = _CURRENT.get()
    return "" if current is None else current.scope


def replay_in_force() -> ReplayAnswers | None:
    return _REPLAY.get()


@contextlib.contextmanager
def replaying(answers: ReplayAnswers) -> Iterator[None]:
    """Answers every request sent through a RecordingTransport inside from `answers`, never the network."""
    token = _REPLAY.set(answers)
    try:
        yield
    finally:
        _REPLAY.reset(token)


@dataclass
class _Tee(httpx.AsyncByteStream):
    """The response body as it streams, kept, and recorded once the reader closes it."""

    inner: httpx.AsyncByteStream
    # Takes the body as read, and whether it was read to its end.
    finish: Callable[[bytes, bool], None]
    parts: list[bytes] = field(default_factory=list)
    ended: bool = False
    recorded: bool = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self.inner:
            self.parts.append(part)
            yield part
        self.ended = True

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            if not self.recorded:
                self.recorded = True
                self.finish(b"".join(self.parts), self.ended)


class RecordingTransport(httpx.AsyncBaseTransport):
    """Sends through `inner`, recording inside a run's scope; answers from the replay while one is installed."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        replay = _REPLAY.get()
        current = _CURRENT.get()
        if replay is None and current is None:
            return await self._inner.handle_async_request(request)
        body = await request.aread()
        sent_at = time.time()
        if replay is not None:
            response = await replay.answer(request, body)
        else:
            response = await self._inner.handle_async_request(request)
        if current is None:
            return response
        status, headers = response.status_code, [[name, value] for name, value in response.headers.multi_items()]

        def finish(answer: bytes, complete: bool) -> None:
            def stored() -> tuple[Exchange, dict[str, bytes]]:
                form, bodies = request_form(body)
                digest = sha256(answer)
                exchange = Exchange(
                    run_id=current.run_id,
                    scope=current.scope,
                    sent_at=sent_at,
                    method=request.method,
                    url=str(request.url),
                    request=form,
                    status=status,
                    headers=headers,
                    body_sha256=digest,
                    complete=complete,
                )
                return exchange, {**bodies, digest: answer}

            current.store.add_later(current.run_id, stored)

        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=status,
            headers=response.headers,
            stream=_Tee(response.stream, finish),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()
