"""One client for any OpenAI-compatible chat endpoint (OpenAI, Together, vLLM, Ollama, llama.cpp).

Streams every reply, collects native tool calls (or parses the text protocol
for models without them), and retries only what is safe to retry: a 429 or a
5xx answered before any output, or a request that got no response at all (a
dropped or dead keep-alive connection), honouring Retry-After, bounded in
attempts and in time. Anything else, including a stream that breaks after text
has arrived, is raised as ProviderError; it is never turned into text.

Each request has a total deadline (request_timeout) and an idle limit (idle_timeout:
silence between bytes), so keep-alive comments cannot extend a request without bound.
Events are read by quarry.agent.sse, the reply is assembled by quarry.agent.reply.

It speaks the chat-completions protocol over one keep-alive httpx client: the
openai SDK's request transforms and per-chunk models cost more than the rest
of an agent turn together (docs/benchmarks.md). Each stream is read to its end,
so its connection goes back to the pool: quarry.agent.pool's, which finds an
idle connection without walking them all (httpcore's own pool does, on every
request), holds up to 1000 at once, and drops one that expired or that the
server closed while it was idle. With a proxy set in the environment
(HTTP_PROXY, HTTPS_PROXY, ALL_PROXY), httpx's own transport and pool route
instead.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import json
import math
import random
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from opentelemetry import trace

from quarry.agent import text_protocol
from quarry.agent.messages import Message
from quarry.agent.pool import PooledTransport, environment_proxy
from quarry.agent.reply import AssembledReply
from quarry.agent.sse import Events, StreamError, error_message, error_text
from quarry.agent.usage import Usage
from quarry.recording import RecordingTransport
from quarry.telemetry import meter, tracer

if TYPE_CHECKING:
    from quarry.config import ModelTier, QuarrySettings

_TOKENS = meter.create_counter("quarry.tokens", unit="{token}", description="model tokens, by tier, model and type")

TextListener = Callable[[str], Awaitable[None] | None]

# Connections to the model endpoint, open at once and kept between calls.
_MAX_CONNECTIONS = 1000


class ProviderError(Exception):
    """The model provider failed; the run that asked must fail honestly."""


class _StatusError(Exception):
    """The endpoint answered with an HTTP error status."""

    def __init__(self, status_code: int, headers: Mapping[str, str], message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.headers = headers
        self.message = message


class _NotAnswered(Exception):
    """The request got no response at all (a dropped or dead connection): safe to send again."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


# Failures before any response byte: the server cannot have acted on a request it never answered.
_UNANSWERED = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class _ListenerFailed(Exception):
    """The caller's text listener raised: its error, not a provider failure."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class ModelSettings:
    base_url: str
    model: str
    api_key: str = "unused"
    # False for models without native tool calling: tools go through the text protocol.
    native_tools: bool = True
    # Seconds one request may take in all, streaming included.
    request_timeout: float = 120.0
    # Seconds the endpoint may stay silent (no byte, keep-alive comments included) within a request.
    idle_timeout: float = 60.0
    max_attempts: int = 4
    # Total seconds spent retrying one completion, waits included.
    retry_budget: float = 60.0
    temperature: float | None = None
    # Which tier calls it ("supervisor", "worker"): a label on token metrics.
    tier: str = "agent"
    # The prefix of that tier's own settings ("QUARRY_WORKER_"), for errors that say what to set;
    # empty where only the shared QUARRY_MODEL_* settings apply.
    env_prefix: str = ""

    @classmethod
    def for_tier(cls, tier: ModelTier, common: QuarrySettings, *, fallback: ModelTier | None = None) -> ModelSettings:
        """A tier's model: each of its settings that is unset falls back to `fallback`'s (when given: a worker's
        supervisor tier falls back to the worker's own model), then to the shared one."""
        tiers = (tier,) if fallback is None else (tier, fallback)

        def first(name: str) -> Any:
            return next((value for t in tiers if (value := getattr(t, name)) not in (None, "")), None)

        native_tools = first("model_native_tools")
        return cls(
            base_url=first("model_base_url") or common.model_base_url,
            model=first("model_name") or common.model_name,
            api_key=first("model_api_key") or common.model_api_key,
            native_tools=common.model_native_tools if native_tools is None else native_tools,
            request_timeout=first("model_request_timeout") or common.model_request_timeout,
            idle_timeout=first("model_idle_timeout") or common.model_idle_timeout,
            tier=tier.service_name,
            env_prefix=tier.model_config.get("env_prefix", ""),
        )

    def setting(self, name: str) -> str:
        """The variables that set `name` (e.g. "MODEL_BASE_URL") for this model, as a user writes them."""
        shared = f"QUARRY_{name}"
        return f"{self.env_prefix}{name} (or {shared} for every tier)" if self.env_prefix else shared


@dataclass(frozen=True)
class ModelReply:
    message: Message
    usage: Usage
    finish_reason: str
    # Text-protocol blocks that could not be read, to tell the model about.
    protocol_errors: list[str] = field(default_factory=list)

    @property
    def usage_estimated(self) -> bool:
        """The server reported no usage: `usage` is estimated from characters."""
        return self.usage.estimated_calls > 0


def _retry_after(error: _StatusError) -> float | None:
    """Seconds the provider asked us to wait, or None when it said nothing usable."""
    headers = error.headers
    candidates: list[float] = []
    try:
        if "retry-after-ms" in headers:
            candidates.append(float(headers["retry-after-ms"]) / 1000)
        if "retry-after" in headers:
            value = headers["retry-after"]
            try:
                candidates.append(float(value))
            except ValueError:
                candidates.append(email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (ValueError, TypeError, OverflowError):
        pass  # a malformed header is no instruction
    usable = [value for value in candidates if math.isfinite(value)]
    return max(0.0, usable[0]) if usable else None


# The settings to check when the endpoint answers with one of these statuses.
_STATUS_HINTS = {401: ("MODEL_API_KEY",), 403: ("MODEL_API_KEY",), 404: ("MODEL_NAME", "MODEL_BASE_URL")}


def v1_hint(base_url: str) -> str:
    """ "did you mean http://host:port/v1?" for a base URL with no path at all (the usual slip with vLLM, Ollama
    and most OpenAI-compatible servers, which serve under /v1); "" otherwise."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.path.strip("/") or not parts.netloc:
        return ""
    return f"did you mean {base_url.rstrip('/')}/v1?"


def _retryable(error: Exception) -> bool:
    if isinstance(error, _NotAnswered):
        return True
    return isinstance(error, _StatusError) and (error.status_code == 429 or error.status_code >= 500)


class ModelClient:
    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self._server_address = urllib.parse.urlsplit(settings.base_url).hostname or ""
        self._url = f"{settings.base_url.rstrip('/')}/chat/completions"
        # One client for every call: its connections stay open between turns, one per concurrent call
        # (httpx's default keeps 20, so a busy worker would reconnect on most turns), in a pool that finds
        # one without walking them all (quarry.agent.pool); behind a proxy, httpx's own transport routes.
        # httpx's timeout bounds each step (connect, each read, each write): the idle limit; the total
        # deadline is _complete's.
        limits = httpx.Limits(max_connections=_MAX_CONNECTIONS, max_keepalive_connections=_MAX_CONNECTIONS)
        # Every call passes the run's recording (quarry.recording); through a proxy from the environment,
        # httpx's own mounts send it instead, unrecorded.
        self._transport = None if environment_proxy() else PooledTransport(limits)
        self._client = httpx.AsyncClient(
            timeout=settings.idle_timeout,
            limits=limits,
            transport=RecordingTransport(self._transport or httpx.AsyncHTTPTransport(limits=limits)),
            headers={"authorization": f"Bearer {settings.api_key}", "accept": "application/json"},
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
        *,
        call_id_prefix: str,
        on_text: TextListener | None = None,
    ) -> ModelReply:
        """One assistant turn. Raises ProviderError when the provider fails for good."""
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",  # the protocol: any OpenAI-compatible endpoint
            "gen_ai.request.model": self.settings.model,
            "server.address": self._server_address,
        }
        with tracer.start_as_current_span(
            f"chat {self.settings.model}", kind=trace.SpanKind.CLIENT, attributes=attributes
        ) as span:
            reply = await self._complete(messages, tools, call_id_prefix=call_id_prefix, on_text=on_text)
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": reply.usage.input_tokens,
                    "gen_ai.usage.output_tokens": reply.usage.output_tokens,
                    "gen_ai.response.finish_reasons": [reply.finish_reason],
                }
            )
        labels = {"quarry.tier": self.settings.tier, "gen_ai.request.model": self.settings.model}
        _TOKENS.add(reply.usage.input_tokens, {**labels, "gen_ai.token.type": "input"})
        _TOKENS.add(reply.usage.output_tokens, {**labels, "gen_ai.token.type": "output"})
        return reply

    async def _complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        *,
        call_id_prefix: str,
        on_text: TextListener | None,
    ) -> ModelReply:
        deadline = time.monotonic() + self.settings.retry_budget
        for attempt in range(1, self.settings.max_attempts + 1):
            emitted = False

            async def forward(text: str) -> None:
                nonlocal emitted
                emitted = True
                if on_text is not None:
                    try:
                        result = on_text(text)
                        if inspect.isawaitable(result):
                            await result
                    except Exception as error:
                        raise _ListenerFailed(error) from error

            try:
                async with asyncio.timeout(self.settings.request_timeout):
                    return await self._stream(messages, tools, call_id_prefix, forward)
            except ProviderError:
                raise
            except _ListenerFailed as failed:
                raise failed.error from None
            except Exception as error:  # httpx, the endpoint or a broken stream: all are provider failures
                if emitted or not _retryable(error) or attempt == self.settings.max_attempts:
                    raise ProviderError(self._failure(error)) from error
                wait = _retry_after(error) if isinstance(error, _StatusError) else None
                if wait is None:
                    wait = min(8.0, 0.25 * 2 ** (attempt - 1)) * (0.5 + random.random())
                if time.monotonic() + wait > deadline:
                    raise ProviderError(f"{self._failure(error)}; retrying would pass the retry budget") from error
                await asyncio.sleep(wait)
        raise AssertionError("unreachable: the loop returns or raises")

    def _failure(self, error: Exception) -> str:
        """Why a request failed, at which endpoint, and the setting that fixes it when one does."""
        url, setting = self.settings.base_url, self.settings.setting
        if isinstance(error, _NotAnswered):
            error = error.error
        if isinstance(error, TimeoutError):  # the total deadline, as asyncio.timeout raises it
            return (
                f"model request failed: {url} did not finish within {self.settings.request_timeout:g} s "
                f"(TimeoutError: the whole request's limit); {setting('MODEL_REQUEST_TIMEOUT')} allows longer"
            )
        if isinstance(error, httpx.TimeoutException):
            return (
                f"model request failed: {url} sent nothing for {self.settings.idle_timeout:g} s "
                f"({_describe(error)}); {setting('MODEL_IDLE_TIMEOUT')} allows longer silence"
            )
        if isinstance(error, httpx.ConnectError):
            why = _describe(error)  # refused, unknown host
            return (
                f"model request failed: cannot reach {url} ({why}); start the model server there, "
                f"or set {setting('MODEL_BASE_URL')} to the URL it serves"
            )
        if isinstance(error, _StatusError) and error.status_code in _STATUS_HINTS:
            check = " and ".join(setting(name) for name in _STATUS_HINTS[error.status_code])
            hint = v1_hint(url) if error.status_code == 404 else ""
            return f"model request failed: {url} answered {_describe(error)}; {hint + ' ' if hint else ''}check {check}"
        return f"model request failed: {_describe(error)} (from {url})"

    async def _stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        call_id_prefix: str,
        forward: Callable[[str], Awaitable[None]],
    ) -> ModelReply:
        native = self.settings.native_tools
        payload: list[dict[str, Any]]
        if native:
            payload = [message.to_openai() for message in messages]
        else:
            payload = text_protocol.render_history(messages)
            if tools:
                payload = _with_tool_instructions(payload, text_protocol.instructions(tools))
        request: dict[str, Any] = {
            "model": self.settings.model,
            "messages": payload,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if native and tools:
            request["tools"] = list(tools)
        if self.settings.temperature is not None:
            request["temperature"] = self.settings.temperature
        # With the text protocol, tool_call blocks arrive as text: the listener gets the prose once it
        # is parsed, so a tool call is never passed on as text.
        live = native or not tools
        text = json.dumps(request, ensure_ascii=False)
        headers = {"content-type": "application/json"}
        request_out = self._client.build_request("POST", self._url, content=text.encode(), headers=headers)
        try:
            response = await self._client.send(request_out, stream=True)
        except _UNANSWERED as error:
            raise _NotAnswered(error) from error
        # Closed however this ends: read whole, its connection returns to the pool; cut short (a failure,
        # a cancellation), httpx drops it rather than reuse it half-read.
        try:
            if response.status_code >= 400:
                raise _StatusError(response.status_code, response.headers, error_message(await response.aread()))
            pieces = AssembledReply()
            done = await self._read(response, pieces, forward if live else None)
            return await self._reply(pieces, done, len(text), native, call_id_prefix, forward, live=live)
        finally:
            await response.aclose()

    async def _read(
        self, response: httpx.Response, pieces: AssembledReply, forward: Callable[[str], Awaitable[None]] | None
    ) -> bool:
        """Read the answer into `pieces`; True when it is known whole ([DONE], or one JSON completion)."""
        lines = response.aiter_lines()
        if _is_json(response):
            body = await response.aread()
            completion = _json_object(body)
            if completion is not None:  # the server ignored `stream: true` and answered with the whole completion
                if completion.get("error"):
                    raise StreamError(f"the endpoint reported an error: {error_text(completion)}")
                text = pieces.add_completion(completion)
                if text and forward is not None:
                    await forward(text)
                return True
            lines = _body_lines(body)  # a stream labelled JSON: read as the stream it is, as the openai SDK does
        events = Events(lines)
        async for chunk in events.chunks():
            text = pieces.add(chunk)
            if text and forward is not None:
                await forward(text)
        return events.done

    async def _reply(
        self,
        pieces: AssembledReply,
        done: bool,
        prompt_chars: int,
        native: bool,
        call_id_prefix: str,
        forward: Callable[[str], Awaitable[None]],
        *,
        live: bool,
    ) -> ModelReply:
        finish_reason = pieces.finish(done)
        if not finish_reason:
            raise ProviderError(f"the model stream from {self.settings.base_url} ended without a finish reason")
        usage = pieces.estimated_usage(prompt_chars) if pieces.usage is None else pieces.usage
        content = "".join(pieces.text)
        if native:
            message = Message("assistant", content, tool_calls=pieces.tool_calls(call_id_prefix))
            return ModelReply(message, usage, finish_reason)
        parsed = text_protocol.parse_reply(content, call_id_prefix=call_id_prefix)
        if not live and parsed.prose:
            await forward(parsed.prose)
        message = Message("assistant", content, tool_calls=tuple(parsed.calls))
        return ModelReply(message, usage, finish_reason, parsed.errors)


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


async def _body_lines(body: bytes) -> AsyncIterator[str]:
    for line in body.decode(errors="replace").splitlines():
        yield line


def _is_json(response: httpx.Response) -> bool:
    kind = response.headers.get("content-type", "")
    return "json" in kind and "event-stream" not in kind


def _with_tool_instructions(payload: list[dict[str, Any]], instructions: str) -> list[dict[str, Any]]:
    if payload and payload[0]["role"] == "system":
        return [{"role": "system", "content": f"{payload[0]['content']}\n\n{instructions}"}, *payload[1:]]
    return [{"role": "system", "content": instructions}, *payload]


def _describe(error: Exception) -> str:
    if isinstance(error, _StatusError | StreamError):
        return str(error)
    return f"{type(error).__name__}: {error}"
