"""Answers a replay's HTTP requests from a recording, and says where the replay first departs from it.

A request is matched to a recorded exchange by what it asks: a chat request by its messages and tools
(whatever the model server's address), any other by its method, URL and body. The ids a replay mints
afresh (its run id, its scratchpad thread) are read as the recorded ones before matching, and written back
into what is served. Model calls are answered in the order they were recorded, and each scratchpad append
waits for the entries recorded before it (`before_append`), so that parallel agents write to the scratchpad
in the recorded order; every such wait is bounded. A request the recording lacks is a divergence: it is
answered with an error, and described by the recorded step it departs from and the first message that differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from quarry.recording import Exchange, canonical, current_scope, request_form
from quarry.replay.qrun import RunRecording

# How long a model call waits for the calls recorded before it; one that never comes is then passed over.
ORDER_WAIT_SECONDS = 2.0
_CHAT = "/chat/completions"
_SNIPPET = 60


@dataclass(frozen=True)
class Divergence:
    """Where a replay first did something the recording did not."""

    # The recorded exchange it departs from, numbered from 1 in the order they were sent; 0: none is close.
    step: int
    # Who made the request in the replay: "supervisor", or the delegation's id.
    scope: str
    what: str

    def __str__(self) -> str:
        where = f"step {self.step}" if self.step else "a step the recording lacks"
        return f"{where} ({self.scope}): {self.what}"


def _is_chat(url: str) -> bool:
    return url.endswith(_CHAT)


def _key(method: str, url: str, form: dict[str, Any]) -> tuple[str, ...]:
    if _is_chat(url):
        return ("chat", *form.get("messages", ()), "|tools|", *form.get("tools", ()))
    return (method, url, str(form.get("body", "")))


class _Body(httpx.AsyncByteStream):
    """A recorded body; one the recording saw cut short ends in a read error, as it did then."""

    def __init__(self, body: bytes, complete: bool) -> None:
        self._body = body
        self._complete = complete

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._body
        if not self._complete:
            raise httpx.ReadError("the recorded response ended here")


@dataclass
class ReplaySource:
    recording: RunRecording
    order_wait_seconds: float = ORDER_WAIT_SECONDS
    divergences: list[Divergence] = field(default_factory=list)
    # (replayed, recorded) id pairs
    _ids: list[tuple[str, str]] = field(default_factory=list)
    _pending: dict[tuple[str, ...], deque[int]] = field(default_factory=dict)
    _served: list[bool] = field(default_factory=list)
    _passed_over: set[int] = field(default_factory=set)
    _progress: asyncio.Condition | None = None
    _notifying: set[asyncio.Future[None]] = field(default_factory=set)

    # Each author's recorded entries of each kind, in order, as (sequence number, preview); the newest entry in.
    _entries: dict[tuple[str, str], list[tuple[int, str]]] = field(default_factory=dict)
    _last_entry: int = 0

    def __post_init__(self) -> None:
        exchanges = self.recording.exchanges
        for index, exchange in enumerate(exchanges):
            self._pending.setdefault(_key(exchange.method, exchange.url, exchange.request), deque()).append(index)
        self._served = [False] * len(exchanges)
        for event in self.recording.events:
            entry = event.get("scratchpad")
            if entry:
                author = (entry.get("author") or {}).get("principalId", "")
                planned = (int(entry.get("scratchpadSequenceNo", 0)), str(entry.get("preview", "")).removesuffix("…"))
                self._entries.setdefault((author, entry.get("kind", "")), []).append(planned)

    def learn_id(self, recorded: str, replayed: str) -> None:
        """An id the replay minted where the recording has another (its run id, its scratchpad thread)."""
        if recorded and replayed and recorded != replayed:
            self._ids.append((replayed, recorded))

    def unserved(self) -> list[int]:
        """Recorded steps (numbered from 1) the replay never asked for."""
        return [index + 1 for index, served in enumerate(self._served) if not served]

    def ids(self) -> list[tuple[str, str]]:
        """The (replayed, recorded) id pairs learned so far."""
        return list(self._ids)

    def describe(self, step: int) -> str:
        exchange = self.recording.exchanges[step - 1]
        return f"{exchange.method} {exchange.url} by {exchange.scope}"

    def first_divergence(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def _as_recorded(self, text: str) -> str:
        for replayed, recorded in self._ids:
            text = text.replace(replayed, recorded)
        return text

    def _as_replayed(self, body: bytes) -> bytes:
        for replayed, recorded in self._ids:
            body = body.replace(recorded.encode(), replayed.encode())
        return body

    async def answer(self, request: httpx.Request, body: bytes) -> httpx.Response:
        url = self._as_recorded(str(request.url))
        seen = self._as_recorded(body.decode(errors="replace")).encode() if body else b""
        form, _ = request_form(seen)
        queue = self._pending.get(_key(request.method, url, form))
        if not queue:
            divergence = self._describe(request.method, url, seen, form)
            self.divergences.append(divergence)
            message = f"replay diverged at {divergence}"
            status = 400 if _is_chat(url) else 404
            return httpx.Response(status, json={"error": {"message": message, "type": "replay_divergence"}})
        index = queue.popleft()
        if _is_chat(url):
            await self._after_earlier_calls(index)
        self._served[index] = True
        self._wake()
        return self._response(self.recording.exchanges[index])

    async def before_append(self, author: str, kind: str, content: str, preview: str) -> None:
        """Holds an append until the entries recorded before it are in, so that parallel agents' entries take
        their recorded numbers; one that never comes holds it for the order wait at most.

        The entry is the author's next recorded one of its kind whose recorded preview is its preview (a ledger
        record's headline), or begins its content (prose, and recordings made before previews were headlines),
        the supervisor writing one assignment per delegation in whatever order they get there; else the author's
        next one of its kind."""
        planned = self._entries.get((self._as_recorded(author), kind))
        if not planned:
            return  # an entry the recording lacks: the replay differs, and says so where it shows
        text, shown = self._as_recorded(content), self._as_recorded(preview).removesuffix("…")
        # A recording's preview is the entry's headline; an older recording's, the start of its text.
        chosen = next((n for n, (_, preview) in enumerate(planned) if preview == shown or text.startswith(preview)), 0)
        expected, _ = planned.pop(chosen)
        progress = self._condition()
        with contextlib.suppress(TimeoutError):
            async with progress:
                await asyncio.wait_for(
                    progress.wait_for(lambda: self._last_entry >= expected - 1), self.order_wait_seconds
                )

    def appended(self, sequence_no: int) -> None:
        self._last_entry = max(self._last_entry, sequence_no)
        self._wake()

    def _wake(self) -> None:
        """Tells whatever waits on the recorded order that it moved on (an answer served, an entry in)."""
        progress = self._condition()

        async def notify() -> None:
            async with progress:
                progress.notify_all()

        task = asyncio.ensure_future(notify())
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    def _response(self, exchange: Exchange) -> httpx.Response:
        headers = [(n, v) for n, v in exchange.headers if n.lower() not in ("content-length", "transfer-encoding")]
        body = self.recording.blob(exchange.body_sha256)
        if not any(name.lower() == "content-encoding" for name, _ in headers):
            body = self._as_replayed(body)
        return httpx.Response(exchange.status, headers=headers, stream=_Body(body, exchange.complete))

    def _condition(self) -> asyncio.Condition:
        if self._progress is None:
            self._progress = asyncio.Condition()
        return self._progress

    async def _after_earlier_calls(self, index: int) -> None:
        """Waits until every model call recorded before this one was answered; one that does not come within
        the wait is passed over for good, so that a call the replay never makes delays it once."""
        exchanges = self.recording.exchanges
        earlier = [i for i in range(index) if _is_chat(exchanges[i].url) and not self._done(i)]
        if not earlier:
            return
        progress = self._condition()
        try:
            async with progress:
                await asyncio.wait_for(
                    progress.wait_for(lambda: all(self._done(i) for i in earlier)), self.order_wait_seconds
                )
        except TimeoutError:
            self._passed_over.update(i for i in earlier if not self._served[i])

    def _done(self, index: int) -> bool:
        return self._served[index] or index in self._passed_over

    def _describe(self, method: str, url: str, body: bytes, form: dict[str, Any]) -> Divergence:
        scope = self._as_recorded(current_scope())
        if not _is_chat(url):
            return Divergence(0, scope, f"a {method} request for {url} that the recording does not have")
        messages: Sequence[str] = form.get("messages", ())
        best, best_shared = -1, -1
        for index, exchange in enumerate(self.recording.exchanges):
            if not _is_chat(exchange.url):
                continue
            recorded = exchange.request.get("messages", ())
            shared = next((n for n, (a, b) in enumerate(zip(recorded, messages, strict=False)) if a != b), None)
            shared = min(len(recorded), len(messages)) if shared is None else shared
            if shared > best_shared:
                best, best_shared = index, shared
        if best < 0:
            return Divergence(0, scope, "a model call, where the recording has none")
        exchange = self.recording.exchanges[best]
        recorded = exchange.request.get("messages", ())
        document = json.loads(body)
        if best_shared < min(len(recorded), len(messages)):
            was = json.loads(self.recording.blob(recorded[best_shared]))
            now = document["messages"][best_shared]
            role = now.get("role", "?")
            return Divergence(
                best + 1,
                scope,
                f"model call: message {best_shared + 1} ({role}) differs: {_difference(was, now)}",
            )
        if len(recorded) != len(messages):
            return Divergence(
                best + 1, scope, f"model call: {len(messages)} messages where the recording has {len(recorded)}"
            )
        return Divergence(best + 1, scope, "model call: the tools offered differ from the recorded ones")


def _difference(was: Any, now: Any) -> str:
    """The first place two messages' text differs, with a little of each around it."""
    before = canonical(was).decode()
    after = canonical(now).decode()
    at = next((n for n, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), min(len(before), len(after)))
    start = max(0, at - _SNIPPET // 2)
    return f"recorded …{before[start : at + _SNIPPET]!r}…, replayed …{after[start : at + _SNIPPET]!r}…"
