"""One client for any OpenAI-compatible chat endpoint (OpenAI, Together, vLLM, Ollama, llama.cpp).

Streams every reply, collects native tool calls (or parses the text protocol
for models without them), and retries only what is safe to retry: a 429 or a
5xx answered before any output, honouring Retry-After, bounded in attempts
and in time. Anything else, including a stream that breaks after text has
arrived, is raised as ProviderError; it is never turned into text.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import math
import random
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import openai
from opentelemetry import trace

from quarry.agent import text_protocol
from quarry.agent.messages import Message, ToolCall
from quarry.agent.usage import Usage
from quarry.telemetry import meter, tracer

if TYPE_CHECKING:
    from quarry.config import ModelTier, QuarrySettings

_TOKENS = meter.create_counter("quarry.tokens", unit="{token}", description="model tokens, by tier, model and type")

TextListener = Callable[[str], Awaitable[None] | None]


class ProviderError(Exception):
    """The model provider failed; the run that asked must fail honestly."""


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
    # Seconds one request may take, streaming included.
    request_timeout: float = 120.0
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


def _retry_after(error: openai.APIStatusError) -> float | None:
    """Seconds the provider asked us to wait, or None when it said nothing usable."""
    headers = error.response.headers
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


def _retryable(error: Exception) -> bool:
    return isinstance(error, openai.APIStatusError) and (error.status_code == 429 or error.status_code >= 500)


class ModelClient:
    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self._server_address = urllib.parse.urlsplit(settings.base_url).hostname or ""
        # Retries are ours (see complete); the SDK's would also retry mid-stream failures.
        self._client = openai.AsyncOpenAI(
            base_url=settings.base_url, api_key=settings.api_key, max_retries=0, timeout=settings.request_timeout
        )

    async def close(self) -> None:
        await self._client.close()

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
                return await self._stream(messages, tools, call_id_prefix, forward)
            except ProviderError:
                raise
            except _ListenerFailed as failed:
                raise failed.error from None
            except Exception as error:  # the SDK, httpx or a broken stream: all are provider failures
                if emitted or not _retryable(error) or attempt == self.settings.max_attempts:
                    raise ProviderError(self._failure(error)) from error
                assert isinstance(error, openai.APIStatusError)
                wait = _retry_after(error)
                if wait is None:
                    wait = min(8.0, 0.25 * 2 ** (attempt - 1)) * (0.5 + random.random())
                if time.monotonic() + wait > deadline:
                    raise ProviderError(f"{self._failure(error)}; retrying would pass the retry budget") from error
                await asyncio.sleep(wait)
        raise AssertionError("unreachable: the loop returns or raises")

    def _failure(self, error: Exception) -> str:
        """Why a request failed, at which endpoint, and the setting that fixes it when one does."""
        url, setting = self.settings.base_url, self.settings.setting
        if isinstance(error, openai.APITimeoutError):
            return (
                f"model request failed: {url} did not answer within {self.settings.request_timeout:g} s "
                f"({_describe(error)}); {setting('MODEL_REQUEST_TIMEOUT')} allows longer"
            )
        if isinstance(error, openai.APIConnectionError):
            # The SDK says only "Connection error."; its cause says why (refused, unknown host).
            why = error.__cause__ or _describe(error)
            return (
                f"model request failed: cannot reach {url} ({why}); start the model server there, "
                f"or set {setting('MODEL_BASE_URL')} to the URL it serves"
            )
        if isinstance(error, openai.APIStatusError) and error.status_code in _STATUS_HINTS:
            check = " and ".join(setting(name) for name in _STATUS_HINTS[error.status_code])
            return f"model request failed: {url} answered {_describe(error)}; check {check}"
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
        stream = await self._client.chat.completions.create(**request)
        # With the text protocol, tool_call blocks arrive as text: the listener gets the prose once it
        # is parsed, so a tool call is never passed on as text.
        live = native or not tools
        try:
            return await self._collect(stream, native, call_id_prefix, forward, live=live)
        finally:
            await stream.close()  # also on failure and cancellation: the connection is not left open

    async def _collect(
        self,
        stream: Any,
        native: bool,
        call_id_prefix: str,
        forward: Callable[[str], Awaitable[None]],
        *,
        live: bool,
    ) -> ModelReply:
        pieces = _StreamedReply()
        async for chunk in stream:
            text = pieces.add(chunk)
            if text and live:
                await forward(text)
        if not pieces.finish_reason:
            raise ProviderError(f"the model stream from {self.settings.base_url} ended without a finish reason")
        content = "".join(pieces.text)
        if native:
            message = Message("assistant", content, tool_calls=pieces.tool_calls(call_id_prefix))
            return ModelReply(message, pieces.usage, pieces.finish_reason)
        parsed = text_protocol.parse_reply(content, call_id_prefix=call_id_prefix)
        if not live and parsed.prose:
            await forward(parsed.prose)
        message = Message("assistant", content, tool_calls=tuple(parsed.calls))
        return ModelReply(message, pieces.usage, pieces.finish_reason, parsed.errors)


class _StreamedReply:
    """A streamed completion put back together: text, native tool calls by index, usage, finish reason."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.usage = Usage()
        self.finish_reason = ""
        self._calls: dict[int, dict[str, str]] = {}

    def add(self, chunk: Any) -> str:
        """Take one chunk; returns the text it added."""
        if chunk.usage is not None:
            self.usage = Usage(chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0)
        added = []
        for choice in chunk.choices:
            self.finish_reason = choice.finish_reason or self.finish_reason
            if choice.delta.content:
                added.append(choice.delta.content)
            for call in choice.delta.tool_calls or ():
                self._add_call(call)
        self.text.extend(added)
        return "".join(added)

    def _add_call(self, call: Any) -> None:
        slot = self._calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
        if call.id:
            slot["id"] = call.id
        if call.function is not None:
            slot["name"] += call.function.name or ""
            slot["arguments"] += call.function.arguments or ""

    def tool_calls(self, call_id_prefix: str) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(slot["id"] or f"{call_id_prefix}-{index}", slot["name"], slot["arguments"] or "{}")
            for index, slot in sorted(self._calls.items())
        )


def _with_tool_instructions(payload: list[dict[str, Any]], instructions: str) -> list[dict[str, Any]]:
    if payload and payload[0]["role"] == "system":
        return [{"role": "system", "content": f"{payload[0]['content']}\n\n{instructions}"}, *payload[1:]]
    return [{"role": "system", "content": instructions}, *payload]


def _describe(error: Exception) -> str:
    if isinstance(error, openai.APIStatusError):
        return f"HTTP {error.status_code}: {error.message}"
    return f"{type(error).__name__}: {error}"
