"""A scripted OpenAI-compatible chat server on 127.0.0.1, for tests.

Real HTTP, so the real `openai` client and its failure paths run. Each
request to /v1/chat/completions takes the next step of the script: a reply
(text and/or tool calls, streamed or not) or a fault (an HTTP error, a 429
with Retry-After, a stall, a connection dropped after partial text, a stream
ended cleanly after partial text with neither a finish reason nor [DONE]), either
possibly held until the test says (`Await`). Every request is recorded for
assertions.

/v1/embeddings answers with deterministic vectors (`bag_of_words_vector`): a
hashed bag of words in which the words of `synonyms` count as the word they
stand for, so texts that say the same thing in those words land close together.
Scripted faults for it queue in `embedding_faults`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.loopback import Served, serve_on_loopback


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any] | str  # a str is sent verbatim, e.g. malformed JSON
    id: str = ""


@dataclass(frozen=True)
class Reply:
    content: str = ""
    calls: tuple[Call, ...] = ()
    input_tokens: int = 10
    output_tokens: int = 5
    # How many pieces the content is streamed in.
    chunks: int = 3
    # Seconds to "think" before the first byte.
    delay: float = 0.0
    # Whether the reply reports its token usage (some servers never do).
    usage: bool = True


@dataclass(frozen=True)
class HttpError:
    status: int
    retry_after: str | None = None
    message: str = "scripted failure"


@dataclass(frozen=True)
class Stall:
    """Accept the request, then say nothing for this long."""

    seconds: float


@dataclass(frozen=True)
class StallAfter:
    """Stream this text, then say nothing more for this long (the connection stays open)."""

    text: str
    seconds: float


@dataclass(frozen=True)
class DropAfter:
    """Stream this text, then cut the connection without finishing."""

    text: str


@dataclass(frozen=True)
class EndWithout:
    """Stream this text, then end the response cleanly (a proper chunked end, the connection kept) with
    neither a finish_reason nor [DONE]: a provider that stopped early without saying so."""

    text: str


@dataclass(frozen=True)
class ErrorEvent:
    """Start a stream, then send an error event in it (as providers report a failure mid-stream)."""

    message: str


@dataclass(frozen=True)
class Await:
    """Hold the request until the test sets `event` (e.g. once a restarted service serves), then take `then`."""

    event: asyncio.Event
    then: Reply | HttpError | Stall | StallAfter | DropAfter | EndWithout | ErrorEvent


Step = Reply | HttpError | Stall | StallAfter | DropAfter | EndWithout | ErrorEvent | Await


@dataclass
class ScriptedModel(Served):
    steps: deque[Step] = field(default_factory=deque)
    # Chooses the answer, from the request, once the script is used up (benchmarks).
    default: Callable[[dict[str, Any]], Step] | None = None
    # Seconds spent answering each request, measured here (the model's share of a run).
    service_times: list[float] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    request_times: list[float] = field(default_factory=list)
    # (arrival, last byte sent, request body), each by time.monotonic(): benchmarks time hops with these.
    exchanges: list[tuple[float, float, dict[str, Any]]] = field(default_factory=list)
    # Word -> the word it stands for, in the embeddings this server answers.
    synonyms: dict[str, str] = field(default_factory=dict)
    # Length of each vector when the request names no `dimensions`; `force_dimensions` overrides both.
    embedding_dimensions: int = 64
    force_dimensions: int | None = None
    # Answered, in order, instead of the next /v1/embeddings requests; None answers as usual.
    embedding_faults: deque[HttpError | None] = field(default_factory=deque)
    embedding_requests: list[dict[str, Any]] = field(default_factory=list)
    # Every vector's values NaN (as some servers answer a broken model), in JSON's NaN literal.
    force_nan: bool = False
    # Each /v1/embeddings answer waits this long; the most requests it had in flight at once.
    embedding_delay: float = 0.0
    embeddings_in_flight_most: int = 0
    _embeddings_in_flight: int = 0
    base_url: str = ""
    _runner: web.AppRunner | None = None
    _closing: asyncio.Event = field(default_factory=asyncio.Event)

    def script(self, *steps: Step) -> None:
        self.steps.extend(steps)

    def forget(self) -> None:
        """Drop the script and all that was recorded, so that a server several tests share starts each clean."""
        self.steps.clear()
        self.default = None
        self.synonyms.clear()
        self.embedding_faults.clear()
        recorded = (self.service_times, self.requests, self.request_times, self.exchanges, self.embedding_requests)
        for kept in recorded:
            kept.clear()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._runner, port = await serve_on_loopback(app)
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        self._closing.set()  # ends stalls, so shutdown does not wait for them
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "tests"}]}
        )

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.embedding_requests.append(body)
        self._embeddings_in_flight += 1
        self.embeddings_in_flight_most = max(self.embeddings_in_flight_most, self._embeddings_in_flight)
        try:
            if self.embedding_delay:
                await asyncio.sleep(self.embedding_delay)
            return self._embeddings_answer(body)
        finally:
            self._embeddings_in_flight -= 1

    def _embeddings_answer(self, body: dict[str, Any]) -> web.Response:
        fault = self.embedding_faults.popleft() if self.embedding_faults else None
        if fault is not None:
            return web.json_response({"error": {"message": fault.message}}, status=fault.status)
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        dimensions = self.force_dimensions or body.get("dimensions") or self.embedding_dimensions
        data = [
            {
                "object": "embedding",
                "index": index,
                "embedding": [math.nan] * dimensions
                if self.force_nan
                else bag_of_words_vector(text, dimensions, self.synonyms),
            }
            for index, text in enumerate(inputs)
        ]
        tokens = sum(len(text.split()) for text in inputs)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model", "scripted"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        arrival = time.monotonic()
        self.request_times.append(arrival)
        started = time.perf_counter()
        try:
            return await self._answer(request, body)
        finally:
            self.service_times.append(time.perf_counter() - started)
            self.exchanges.append((arrival, time.monotonic(), body))

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if not self.steps and self.default is None:
            return web.json_response({"error": {"message": "the script has no more steps"}}, status=500)
        if self.steps:
            step = self.steps.popleft()
        else:
            assert self.default is not None
            step = self.default(body)
        if isinstance(step, Await):
            waits = [asyncio.ensure_future(step.event.wait()), asyncio.ensure_future(self._closing.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
            step = step.then
        if isinstance(step, Reply) and step.delay:
            await asyncio.sleep(step.delay)
        if isinstance(step, HttpError):
            headers = {"retry-after": step.retry_after} if step.retry_after is not None else {}
            return web.json_response({"error": {"message": step.message}}, status=step.status, headers=headers)
        if isinstance(step, Stall):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), step.seconds)
            return web.json_response({"error": {"message": "stalled"}}, status=500)
        if not body.get("stream"):
            assert isinstance(step, Reply), "faults mid-stream need stream=true"
            return web.json_response(_completion(body, step))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        if isinstance(step, ErrorEvent):
            await response.write(_sse({"error": {"message": step.message, "type": "server_error"}}))
            await response.write_eof()
            return response
        if isinstance(step, StallAfter):
            await response.write(_sse(_chunk(body, {"role": "assistant", "content": step.text})))
            with contextlib.suppress(TimeoutError):  # until the server stops, at the latest
                await asyncio.wait_for(self._closing.wait(), step.seconds)
            return response
        if isinstance(step, DropAfter):
            await response.write(_sse(_chunk(body, {"role": "assistant", "content": step.text})))
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()  # no finish_reason, no [DONE]: a broken stream
            return response
        if isinstance(step, EndWithout):
            await response.write(_sse(_chunk(body, {"role": "assistant", "content": step.text})))
            await response.write_eof()  # the terminating chunk: a clean end, nothing cut
            return response
        for chunk in _chunks(body, step):
            await response.write(_sse(chunk))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _chunk(body: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": body.get("model", "scripted"),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _arguments(call: Call) -> str:
    return call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)


def _chunks(body: dict[str, Any], step: Reply) -> list[dict[str, Any]]:
    chunks = [_chunk(body, {"role": "assistant", "content": ""})]
    size = max(1, -(-len(step.content) // max(1, step.chunks)))
    for start in range(0, len(step.content), size):
        chunks.append(_chunk(body, {"content": step.content[start : start + size]}))
    for index, call in enumerate(step.calls):
        arguments = _arguments(call)
        half = len(arguments) // 2  # arguments arrive in pieces, as real providers send them
        chunks.append(
            _chunk(
                body,
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call.id or f"call_{len(body['messages'])}_{index}",
                            "type": "function",
                            "function": {"name": call.name, "arguments": arguments[:half]},
                        }
                    ]
                },
            )
        )
        chunks.append(_chunk(body, {"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]}))
    chunks.append(_chunk(body, {}, "tool_calls" if step.calls else "stop"))
    if step.usage:
        chunks.append({**_chunk(body, {}), "choices": [], "usage": _usage(step)})
    return chunks


def _completion(body: dict[str, Any], step: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.content}
    if step.calls:
        message["tool_calls"] = [
            {
                "id": call.id or f"call_{index}",
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call)},
            }
            for index, call in enumerate(step.calls)
        ]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "scripted"),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if step.calls else "stop"}],
        "usage": _usage(step),
    }


def _usage(step: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": step.input_tokens,
        "completion_tokens": step.output_tokens,
        "total_tokens": step.input_tokens + step.output_tokens,
    }


# Words too common to say what a text is about.
_STOP_WORDS_TEXT = (
    "a an and are as at be by can do does for from how in is it its of on or that the this to what when which why with"
)
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())


def bag_of_words_vector(text: str, dimensions: int, synonyms: dict[str, str]) -> list[float]:
    """A unit vector: each word (as the word it stands for) adds +1 or -1 to a bucket chosen by its hash."""
    vector = [0.0] * dimensions
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if word in STOP_WORDS:
            continue
        digest = hashlib.blake2b(synonyms.get(word, word).encode(), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "little") % dimensions
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(value * value for value in vector))
    return [value / norm for value in vector] if norm else vector
