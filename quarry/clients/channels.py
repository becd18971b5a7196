"""Channels to Quarry services: TLS, connection limits, tracing, and the bearer token on every call."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import grpc
from opentelemetry import trace

from quarry import telemetry
from quarry.clients.retry import RetryPolicy
from quarry.config import QuarrySettings
from quarry.security import ConnectionLimits, Tls, bearer_metadata

__all__ = ["ApiClient", "Dialer", "api_key_or_environment", "insecure_channel", "open_channel"]


def api_key_or_environment(api_key: str | None) -> str:
    """The API key a public client sends: the one given, else QUARRY_API_KEY ("" when neither)."""
    return os.environ.get("QUARRY_API_KEY", "").strip() if api_key is None else api_key


def open_channel(
    address: str, *, tls: Tls | None = None, limits: ConnectionLimits | None = None, token: str = ""
) -> grpc.aio.Channel:
    """A channel to a Quarry service: TLS when `tls` is given (with this process's certificate, for mutual
    TLS), traced when tracing is on, and carrying a bearer token on every call when `token` is set."""
    options = (limits or ConnectionLimits()).channel_options()
    # grpc files an interceptor under one kind of call only, so each kind gets its own.
    interceptors: list[Any] = [_UnaryCall(token), _StreamCall(token)] if token or telemetry.tracing_enabled() else []
    if tls is not None:
        return grpc.aio.secure_channel(address, tls.channel_credentials(), options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


class ApiClient:
    """What each public API client shares: a channel (its own, with `connect`, closed as the client's async
    context ends; or one passed in, which the caller owns) and the retry policy of its calls."""

    def __init__(self, channel: grpc.aio.Channel, retry: RetryPolicy | None = None) -> None:
        self._channel = channel
        self._retry = retry or RetryPolicy()

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        api_key: str | None = None,
        tls: Tls | None = None,
        limits: ConnectionLimits | None = None,
        retry: RetryPolicy | None = None,
    ) -> Self:
        """A client owning its channel; `api_key` (None: QUARRY_API_KEY) is sent as a bearer token on every
        call, `tls` secures the channel."""
        channel = open_channel(address, tls=tls, limits=limits, token=api_key_or_environment(api_key))
        return cls(channel, retry)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self._channel.close(None)


@dataclass(frozen=True)
class Dialer:
    """How a service reaches the mesh's other services: TLS, connection limits, and its mesh token."""

    tls: Tls | None = None
    limits: ConnectionLimits | None = None
    token: str = ""

    @classmethod
    def from_settings(cls, common: QuarrySettings) -> Dialer:
        return cls(Tls.from_settings(common), ConnectionLimits.from_settings(common), common.mesh_token)

    def channel(self, address: str) -> grpc.aio.Channel:
        return open_channel(address, tls=self.tls, limits=self.limits, token=self.token)


def insecure_channel(address: str) -> grpc.aio.Channel:
    """A plaintext channel with the default limits (a laptop, tests)."""
    return open_channel(address)


if TYPE_CHECKING:
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
else:  # grpc's classes are not subscriptable at run time
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor


class _CallMetadata:
    """What every call carries: the bearer token, and the trace it belongs to with a CLIENT span when traced."""

    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token) if token else ()

    def _with(self, details: Any, extra: Iterable[tuple[str, str]] = ()) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata, *extra)
        return details._replace(metadata=metadata)


class _UnaryCall(_CallMetadata, _UnaryUnary):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        traced = telemetry.client_span(details.method)
        if traced is None:
            return await continuation(self._with(details), request)
        span, carrier = traced
        try:
            call = await continuation(self._with(details, carrier), request)
            code = await call.code()  # the span lasts until the answer
            telemetry.set_rpc_status(span, code, await call.details())
            return call
        except asyncio.CancelledError:
            telemetry.set_rpc_status(span, grpc.StatusCode.CANCELLED)
            raise
        finally:
            span.end()


class _StreamCall(_CallMetadata, _UnaryStream):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        traced = telemetry.client_span(details.method)
        if traced is None:
            return await continuation(self._with(details), request)
        span, carrier = traced
        try:
            call = await continuation(self._with(details, carrier), request)
        except BaseException:
            span.end()
            raise
        return _streamed(call, span)


async def _streamed(call: Any, span: trace.Span) -> AsyncIterator[Any]:
    """The responses of a traced stream; its span lasts until the stream ends."""
    code, details = grpc.StatusCode.OK, None
    try:
        async for response in call:
            yield response
    except grpc.aio.AioRpcError as error:
        code, details = error.code(), error.details()
        raise
    except (asyncio.CancelledError, GeneratorExit):
        code = grpc.StatusCode.CANCELLED
        raise
    finally:
        telemetry.set_rpc_status(span, code, details)
        span.end()
