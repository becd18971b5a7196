"""The server-sent events of a chat-completions stream, as every OpenAI-compatible server sends them.

Beyond `data:` events this reads what real servers add: comments (`: keep-alive` from DeepSeek,
`: OPENROUTER PROCESSING`), empty `data:` heartbeats, llama.cpp's `error:` field, `event: error`,
and `data:` without its space (TGI). After `[DONE]` it reads the response to its end, so that the
connection goes back to the pool instead of being dropped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

# The most of an error body quoted in a failure: enough for a provider's message, never a whole page.
MAX_ERROR_CHARS = 500
# Seconds spent reading what follows [DONE] (normally only the response's end, sent with it): a server that holds
# the response open after it costs its connection, never the reply.
_DRAIN_SECONDS = 0.25


class StreamError(Exception):
    """The endpoint reported an error inside the stream, or sent something that is not a chunk."""


class Events:
    """The decoded chunks of one stream, up to `[DONE]`; `done` says whether `[DONE]` came."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines = lines
        self.done = False

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        data: list[str] = []
        event = ""
        async for line in self._lines:
            if line:
                if line.startswith(":"):  # a comment: keep-alives, OpenRouter's PROCESSING
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data":
                    data.append(value)
                elif name == "event":
                    event = value
                elif name == "error":  # llama.cpp reports a failure (e.g. context overflow) in a field of its own
                    raise StreamError(f"the stream reported an error: {error_text(_decoded(value))}")
                continue
            payload, data, kind, event = "\n".join(data), [], event, ""
            chunk = self._dispatch(payload, kind)
            if chunk is not None:
                yield chunk
            if self.done:
                await self._drain()
                return
        chunk = self._dispatch("\n".join(data), event)  # a last event without its blank line
        if chunk is not None:
            yield chunk

    def _dispatch(self, payload: str, event: str) -> dict[str, Any] | None:
        if event == "error":
            raise StreamError(f"the stream reported an error: {error_text(_decoded(payload))}")
        if not payload.strip():  # an empty `data:` heartbeat, or a blank line with nothing pending
            return None
        if payload.strip() == "[DONE]":
            self.done = True
            return None
        return _chunk(payload)

    async def _drain(self) -> None:
        try:
            async with asyncio.timeout(_DRAIN_SECONDS):
                async for _ in self._lines:
                    pass
        except (TimeoutError, httpx.TransportError):
            pass  # the reply is whole; only the connection is lost


def _decoded(payload: str) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return payload


def _chunk(payload: str) -> dict[str, Any]:
    try:
        chunk = json.loads(payload)
    except ValueError:
        raise StreamError(f"the stream sent an event that is not JSON: {payload[:MAX_ERROR_CHARS]!r}") from None
    if not isinstance(chunk, dict):
        raise StreamError(f"the stream sent an event that is not an object: {payload[:MAX_ERROR_CHARS]!r}")
    if chunk.get("error"):
        raise StreamError(f"the stream reported an error: {error_text(chunk)}")
    return chunk


def error_message(body: bytes) -> str:
    """What an error body says: the provider's message where it gives one, else the body's start."""
    text = body.decode(errors="replace").strip()
    try:
        return error_text(json.loads(text))
    except ValueError:
        return text[:MAX_ERROR_CHARS]


def error_text(data: Any) -> str:
    error = data.get("error", data) if isinstance(data, dict) else data
    message = error.get("message") if isinstance(error, dict) else None
    return str(message if message else error)[:MAX_ERROR_CHARS]
