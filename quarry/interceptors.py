"""The server interceptors every service runs: errors translated to statuses, RPCs measured, requests decoded.

Request messages are decoded inside the handler chain, after the bearer-token check, so bytes that are
no request message are INVALID_ARGUMENT like any other bad input, and an unauthenticated caller's body is
never parsed. `quarry.server` installs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from quarry import telemetry
from quarry.errors import QuarryError, internal_status, to_rpc_status

__all__ = ["ErrorTranslationInterceptor", "RequestDecodingInterceptor"]

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    Context = grpc.aio.ServicerContext[Any, Any]
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # grpc's classes are not subscriptable at run time
    _Interceptor = grpc.aio.ServerInterceptor


async def _abort(context: Context, status: grpc.Status) -> None:
    # The code is set first as well: tracing reads it from set_code, not from abort_with_status.
    context.set_code(status.code)
    context.set_details(status.details)
    # grpc-stubs predates abort_with_status on the aio context.
    await context.abort_with_status(status)  # type: ignore[attr-defined]


async def _translate_errors(context: Context, error: BaseException) -> None:
    if isinstance(error, QuarryError):
        await _abort(context, to_rpc_status(error))
    log.exception("unhandled error in RPC", exc_info=error)
    await _abort(context, internal_status())


_RPC_DURATION = telemetry.meter.create_histogram(
    "rpc.server.duration", unit="ms", description="time to answer an RPC (a stream: until it ends), by method"
)


def _status_of(error: BaseException | None) -> str:
    if error is None:
        return "OK"
    if isinstance(error, QuarryError):
        return error.code.name
    if isinstance(error, asyncio.CancelledError):
        return "CANCELLED"
    return "ABORTED_BY_HANDLER" if isinstance(error, grpc.aio.AbortError) else "INTERNAL"


def _record(method: str, started: float, error: BaseException | None) -> None:
    attributes = {"rpc.system": "grpc", "rpc.method": method, "rpc.grpc.status_code": _status_of(error)}
    _RPC_DURATION.record((time.perf_counter() - started) * 1000, attributes)


@contextlib.asynccontextmanager
async def _observed(context: Context, method: str, traced: bool) -> AsyncIterator[None]:
    """What every handler, unary or streaming, gets around it: its duration recorded by status, its span
    when `traced`, and any error translated to a gRPC status (cancellations and aborts pass through)."""
    started, failure = time.perf_counter(), None  # type: tuple[float, BaseException | None]
    with telemetry.server_span(method, context.invocation_metadata()) if traced else _UNTRACED as span:
        try:
            yield
        except (asyncio.CancelledError, grpc.aio.AbortError) as error:
            failure = error
            raise
        except Exception as error:
            failure = error
            if span is not None:
                span.record_exception(error)
            await _translate_errors(context, error)
        finally:
            _record(method, started, failure)
            if span is not None:
                telemetry.set_rpc_status(span, _code_of(context, failure), context.details())


_UNTRACED = contextlib.nullcontext()


def _code_of(context: Context, failure: BaseException | None) -> grpc.StatusCode:
    """The status the call ends with: what the handler or the error translation set."""
    if isinstance(failure, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    code = context.code()
    return code if isinstance(code, grpc.StatusCode) else _CODES.get(code, grpc.StatusCode.OK)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _wrap_unary(behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
    traced = telemetry.traces_rpcs(method)

    async def wrapper(request: Any, context: Context) -> Any:
        async with _observed(context, method, traced):
            return await behavior(request, context)

    return wrapper


def _wrap_stream(behavior: Callable[..., Any], method: str) -> Callable[..., AsyncIterator[Any]]:
    traced = telemetry.traces_rpcs(method)

    async def wrapper(request: Any, context: Context) -> AsyncIterator[Any]:
        async with _observed(context, method, traced):
            responses = behavior(request, context)
            if inspect.isawaitable(responses):
                # A handler that streams with context.write() instead of yielding.
                await responses
                return
            async for response in responses:
                yield response

    return wrapper


class ErrorTranslationInterceptor(_Interceptor):
    """The one place domain errors become gRPC statuses; anything else is INTERNAL and logged."""

    def __init__(self) -> None:
        # Handlers are fixed once the server starts, so each method is wrapped once.
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any] | None] = {}

    async def intercept_service(  # type: ignore[override]  # grpc returns None for unknown methods
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        if method in self._wrapped:
            return self._wrapped[method]
        handler = _wrap_handler(await continuation(handler_call_details), method)
        if handler is not None:  # unknown methods stay uncached, so junk names cannot grow the map
            self._wrapped[method] = handler
        return handler


def _wrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any] | None, method: str
) -> grpc.RpcMethodHandler[Any, Any] | None:
    if handler is None:
        return None
    codec = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_wrap_unary(handler.unary_unary, method), **codec)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_wrap_stream(handler.unary_stream, method), **codec)
    # Client streaming (reflection): the wrappers pass the request iterator on as they would a request.
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_wrap_unary(handler.stream_unary, method), **codec)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(_wrap_stream(handler.stream_stream, method), **codec)
    return handler


class _UndecodableRequest(QuarryError):
    """The request body is not a serialized request message of the method called."""

    code = grpc.StatusCode.INVALID_ARGUMENT


_Deserializer = Callable[[bytes], Any]


def _decoder(deserializer: _Deserializer, method: str) -> _Deserializer:
    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as error:
            # Not logged above debug: a client sending junk must not flood the log.
            log.debug("undecodable request to %s: %s", method, error)
            raise _UndecodableRequest(f"the request body is not a valid request message for {method}") from None

    return decode


class RequestDecodingInterceptor(_Interceptor):
    """Decodes request messages inside the handler, where a failure is a QuarryError, not in grpc's machinery.

    grpc deserializes a unary request before any handler runs and answers a DecodeError with UNKNOWN and
    an ERROR traceback per call. Innermost of the interceptors, this one registers unary requests as raw
    bytes and decodes them when the handler is called, so the checks around it (the bearer token) run
    first and a bad body is INVALID_ARGUMENT through the error translation. Streamed requests are
    decoded as the handler reads them, which is inside it already; their decoder raises the same error.
    """

    async def intercept_service(  # type: ignore[override]
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        return _decoding(await continuation(details), details.method)


def _decoding(handler: grpc.RpcMethodHandler[Any, Any] | None, method: str) -> grpc.RpcMethodHandler[Any, Any] | None:
    if handler is None or handler.request_deserializer is None:
        return handler
    decode = _decoder(handler.request_deserializer, method)
    serializer = handler.response_serializer
    if handler.unary_unary is not None:
        unary: Any = handler.unary_unary  # a coroutine function on the aio server (grpc-stubs says sync)

        async def unary_behavior(data: bytes, context: Context) -> Any:
            return await unary(decode(data), context)

        return grpc.unary_unary_rpc_method_handler(unary_behavior, response_serializer=serializer)
    if handler.unary_stream is not None:
        streaming: Any = handler.unary_stream  # an async generator, or a coroutine writing with context.write()

        async def stream_behavior(data: bytes, context: Context) -> AsyncIterator[Any]:
            responses = streaming(decode(data), context)
            if inspect.isawaitable(responses):
                await responses
                return
            async for response in responses:
                yield response

        return grpc.unary_stream_rpc_method_handler(stream_behavior, response_serializer=serializer)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            handler.stream_unary, request_deserializer=decode, response_serializer=serializer
        )
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(
            handler.stream_stream, request_deserializer=decode, response_serializer=serializer
        )
    return handler
