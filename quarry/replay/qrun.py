"""The .qrun file: one run's recording, as JSON lines (UTF-8), format version 1.

Each line is one record, an object whose "record" names its kind:

- "header" (first, once): {"format": "quarry-run", "version": 1, "run_id": ..., "settings": {...}}, where
  settings are the services' settings that shape the run's answers (model names, search backend, limits).
- "run" (once): the run as GetRun returns it (quarry.v1.Run in protobuf's JSON mapping), and "approval",
  the decision a run awaiting approval got ({"decision": "approved" or "rejected", "note": ...}) or null.
- "event": each of its events (quarry.v1.RunEvent), in sequence order.
- "worker": the settings of each worker that gave its part of the recording ({"settings": {...}}).
- "exchange": one HTTP exchange an agent made (quarry.recording.Exchange's fields).
- "blob": {"sha256": ..., "text": ...} for a UTF-8 body, or {"sha256": ..., "base64": ...} for any other.

Readers ignore record kinds they do not know, and refuse a version they do not know.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from quarry.recording import Exchange, sha256

FORMAT = "quarry-run"
VERSION = 1


class RecordingError(ValueError):
    """A .qrun file that cannot be read: the message says where and why."""


def line(record: str, **fields: Any) -> bytes:
    return json.dumps({"record": record, **fields}, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def header_line(run_id: str, settings: Mapping[str, Any]) -> bytes:
    return line("header", format=FORMAT, version=VERSION, run_id=run_id, settings=dict(settings))


def exchange_line(exchange: Exchange) -> bytes:
    return line("exchange", **exchange.row())


def blob_line(digest: str, body: bytes) -> bytes:
    try:
        return line("blob", sha256=digest, text=body.decode())
    except UnicodeDecodeError:
        return line("blob", sha256=digest, base64=base64.b64encode(body).decode())


def recording_lines(exchanges: Iterable[Exchange], bodies: Mapping[str, bytes]) -> Iterator[bytes]:
    """Exchanges, then the blobs they refer to, each once."""
    for exchange in exchanges:
        yield exchange_line(exchange)
    for digest, body in bodies.items():
        yield blob_line(digest, body)


@dataclass
class RunRecording:
    """A .qrun file, read."""

    run_id: str
    settings: dict[str, Any]
    run: dict[str, Any] = field(default_factory=dict)
    approval: dict[str, str] | None = None
    workers: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)

    def blob(self, digest: str) -> bytes:
        try:
            return self.blobs[digest]
        except KeyError:
            raise RecordingError(f"the recording lacks the body with SHA-256 {digest}") from None

    def size_bytes(self) -> int:
        """What the recorded bodies take, each counted once."""
        return sum(len(body) for body in self.blobs.values())


def parse(lines: Iterable[bytes]) -> RunRecording:
    recording: RunRecording | None = None
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            kind = record["record"]
        except (ValueError, KeyError, TypeError) as error:
            raise RecordingError(f"line {number} is not a .qrun record ({error})") from None
        if recording is None:
            if kind != "header" or record.get("format") != FORMAT:
                raise RecordingError(f"line {number}: not a {FORMAT} file (it must begin with its header)")
            if record.get("version") != VERSION:
                raise RecordingError(f"format version {record.get('version')!r} is not known (this reads {VERSION})")
            recording = RunRecording(run_id=str(record["run_id"]), settings=dict(record.get("settings") or {}))
            continue
        try:
            _add(recording, kind, record)
        except (KeyError, TypeError, ValueError) as error:
            raise RecordingError(f"line {number}: a {kind!r} record that cannot be read ({error!r})") from None
    if recording is None:
        raise RecordingError("the file is empty")
    # Steps are numbered in the order they were sent, whichever service's part of the file holds them.
    recording.exchanges.sort(key=lambda exchange: exchange.sent_at)
    return recording


def _add(recording: RunRecording, kind: str, record: dict[str, Any]) -> None:
    if kind == "run":
        recording.run = record["run"]
        recording.approval = record.get("approval")
    elif kind == "worker":
        recording.workers.append(dict(record["settings"]))
    elif kind == "event":
        recording.events.append(record["event"])
    elif kind == "exchange":
        recording.exchanges.append(Exchange.from_row(record))
    elif kind == "blob":
        body = record["text"].encode() if "text" in record else base64.b64decode(record["base64"], validate=True)
        if sha256(body) != record["sha256"]:
            raise ValueError(f"the body does not have the SHA-256 it claims ({record['sha256']})")
        recording.blobs[record["sha256"]] = body


def read(path: str) -> RunRecording:
    try:
        with open(path, "rb") as file:
            return parse(file)
    except OSError as error:
        raise RecordingError(f"cannot read {path}: {error.strerror}") from None


# The settings of each service that shape a run's answers: a recording carries them, and a replay's mesh
# is configured with them.
SUPERVISOR_ANSWER_SETTINGS = (
    "model_base_url",
    "model_name",
    "model_native_tools",
    "max_parallel_delegations",
    "context_tokens",
    "verify_runs",
    "verification_reserve",
    "paper_hosts",
    "default_run_timeout_seconds",
)
WORKER_ANSWER_SETTINGS = (
    "id",
    "model_base_url",
    "model_name",
    "model_native_tools",
    "max_concurrent_delegations",
    "default_timeout_seconds",
    "context_tokens",
    "search_backend",
    "searxng_url",
    "arxiv_url",
    "semantic_scholar_url",
    "fetch_allow",
    "page_chunk_chars",
)


def replayed_settings(settings: Any, names: Iterable[str]) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in names}


# The most a piece of a streamed .qrun carries: well under gRPC's 4 MiB message limit.
CHUNK_BYTES = 1 << 20


def chunked(lines: Iterable[bytes], size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Lines as pieces of at most `size` bytes (a long line spans several): concatenated, they are the lines."""
    pending = bytearray()
    for text in lines:
        yield from _full_pieces(pending, text, size)
    if pending:
        yield bytes(pending)


def _full_pieces(pending: bytearray, text: bytes, size: int) -> Iterator[bytes]:
    """Adds `text` to what is pending, and takes out every full piece."""
    pending += text
    while len(pending) >= size:
        yield bytes(pending[:size])
        del pending[:size]


async def lines_of(pieces: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The whole lines that streamed pieces carry, each with its newline."""
    pending = b""
    async for piece in pieces:
        pending += piece
        *whole, pending = pending.split(b"\n")
        for text in whole:
            yield text + b"\n"
    if pending:
        yield pending + b"\n"


async def chunked_async(lines: AsyncIterable[bytes], size: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
    """`chunked`, for lines that arrive over time."""
    pending = bytearray()
    async for text in lines:
        for piece in _full_pieces(pending, text, size):
            yield piece
    if pending:
        yield bytes(pending)


def first_time(seen: set[bytes], text: bytes) -> bool:
    """Whether a recording line is new: a body (by its hash) or a line seen before, as workers that share one
    database both send, is not."""
    key = text
    if text.startswith(b'{"record":"blob"'):
        key = json.loads(text)["sha256"].encode()
    if key in seen:
        return False
    seen.add(key)
    return True
