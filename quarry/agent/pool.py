"""Keep-alive connections to the model endpoint, found in constant time however many are open.

httpcore's pool, the one under httpx, walks every connection it holds on each
request and on each response's end (and counts the idle ones again for each):
at 200 concurrent streams that walk took most of a worker's event loop. This
pool keeps each origin's idle connections on a stack: a request takes the one
used last (dropping any that expired or that the server closed), or opens a
new one; a response read to its end puts its connection back on top, and the
oldest idle one is closed once its keep-alive has expired. Connections in use
and idle together are at most `max_connections`; a request beyond that waits
for one, up to httpx's pool timeout. HTTP/1.1 only, which is what model
servers speak.

`PooledTransport` is httpx's own transport with this pool in place of
httpcore's: httpx's exception mapping (httpx.ConnectError, ReadError,
RemoteProtocolError, the timeouts) and its response streams stay as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator
from types import TracebackType
from typing import Self

import httpcore
import httpx

# The variables that send httpx through a proxy: where one is set, httpx's own transport routes each request.
_PROXY_VARIABLES = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"})


def environment_proxy() -> bool:
    """A proxy is set in the environment (either case), which httpx honours only with its own transport."""
    return any(name.upper() in _PROXY_VARIABLES and value for name, value in os.environ.items())


class KeepAlivePool:
    """httpcore's request interface over per-origin stacks of idle HTTP/1.1 connections, bounded in total."""

    def __init__(self, *, ssl_context: ssl.SSLContext, max_connections: int, keepalive_expiry: float | None) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self._ssl_context = ssl_context
        self._max_connections = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._slots = asyncio.Semaphore(max_connections)
        # By origin as (scheme, host, port): httpcore.Origin compares equal but does not hash.
        self._idle: dict[tuple[bytes, bytes, int], deque[httpcore.AsyncHTTPConnection]] = {}
        # Every connection open, in use or idle: what aclose closes.
        self._open: set[httpcore.AsyncHTTPConnection] = set()
        # Connections opened in all: what tests and benchmarks count.
        self.opened = 0

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        if request.url.scheme not in (b"http", b"https"):
            raise httpcore.UnsupportedProtocol(f"unsupported protocol {request.url.scheme.decode()!r}")
        await self._acquire(request)
        origin = request.url.origin
        connection: httpcore.AsyncHTTPConnection | None = None
        try:
            connection = await self._checkout(origin)
            response = await connection.handle_async_request(request)
        except BaseException:
            if connection is None:
                self._slots.release()
            else:
                await self.release(origin, connection)
            raise
        assert isinstance(response.stream, AsyncIterable)
        return httpcore.Response(
            status=response.status,
            headers=response.headers,
            content=_ReturningStream(response.stream, self, origin, connection),
            extensions=response.extensions,
        )

    async def _acquire(self, request: httpcore.Request) -> None:
        """A slot for one connection, waiting up to httpx's pool timeout when all are in use."""
        if not self._slots.locked():
            await self._slots.acquire()  # a free slot: no wait, no timer
            return
        try:
            async with asyncio.timeout(request.extensions.get("timeout", {}).get("pool")):
                await self._slots.acquire()
        except TimeoutError:
            raise httpcore.PoolTimeout(f"all {self._max_connections} connections stayed in use") from None

    async def _checkout(self, origin: httpcore.Origin) -> httpcore.AsyncHTTPConnection:
        stack = self._idle.get(_key(origin))
        while stack:  # each pass takes one off the stack
            connection = stack.pop()
            if connection.is_idle() and not connection.has_expired():
                return connection
            await self._drop(connection)  # expired, or closed by the server while idle
        if len(self._open) >= self._max_connections:
            # A slot is ours, so some connection is idle: one to another origin, the longest unused there.
            other = next((idle for idle in self._idle.values() if idle), None)
            if other is not None:
                await self._drop(other.popleft())
        connection = httpcore.AsyncHTTPConnection(
            origin, ssl_context=self._ssl_context, keepalive_expiry=self._keepalive_expiry
        )
        self._open.add(connection)
        self.opened += 1
        return connection

    async def release(self, origin: httpcore.Origin, connection: httpcore.AsyncHTTPConnection) -> None:
        """The request on `connection` is over: keep it for the next if httpcore left it idle, else close it."""
        self._slots.release()
        reusable = connection.is_idle() and not connection.is_closed()  # a failed connect reads as both
        if not reusable or connection not in self._open:  # cut short, failed, or the pool was closed
            await self._drop(connection)
            return
        stack = self._idle.setdefault(_key(origin), deque())
        stack.append(connection)
        for _ in range(len(stack) - 1):  # close what expired at the bottom, while the top is in use
            if len(stack) < 2 or not stack[0].has_expired():  # (others may take from it while we close)
                break
            await self._drop(stack.popleft())

    async def _drop(self, connection: httpcore.AsyncHTTPConnection) -> None:
        self._open.discard(connection)
        with contextlib.suppress(Exception):  # closing a dead socket may fail; it is gone either way
            await connection.aclose()

    async def aclose(self) -> None:
        """Close every connection, idle or in use (a response still being read then fails)."""
        closing = list(self._open)
        self._open.clear()
        self._idle.clear()
        for connection in closing:
            with contextlib.suppress(Exception):
                await connection.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()


def _key(origin: httpcore.Origin) -> tuple[bytes, bytes, int]:
    return origin.scheme, origin.host, origin.port


class _ReturningStream:
    """A response's body: closing it (httpx does, once the caller closes the response) returns its connection."""

    def __init__(
        self,
        stream: AsyncIterable[bytes],
        pool: KeepAlivePool,
        origin: httpcore.Origin,
        connection: httpcore.AsyncHTTPConnection,
    ) -> None:
        self._stream = stream
        self._pool = pool
        self._origin = origin
        self._connection = connection
        self._closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._stream.__aiter__()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            closer = getattr(self._stream, "aclose", None)
            if closer is not None:
                await closer()  # httpcore leaves the connection idle if the response was read whole, else closes it
        finally:
            await self._pool.release(self._origin, self._connection)


class PooledTransport(httpx.AsyncHTTPTransport):
    """httpx's transport, its exception mapping and response streams included, over a KeepAlivePool.

    Of `limits`, max_connections bounds idle and busy connections together and keepalive_expiry ends idle
    ones; max_keepalive_connections is not used (idle connections are bounded by max_connections)."""

    def __init__(self, limits: httpx.Limits) -> None:
        if limits.max_connections is None:
            raise ValueError("PooledTransport needs a bound: httpx.Limits(max_connections=...)")
        ssl_context = httpx.create_ssl_context()
        super().__init__(verify=ssl_context, limits=limits)
        self.pool = KeepAlivePool(
            ssl_context=ssl_context, max_connections=limits.max_connections, keepalive_expiry=limits.keepalive_expiry
        )
        # httpx 0.28 (pinned in pyproject.toml) sends every request through this attribute, inside its mapping.
        self._pool = self.pool  # type: ignore[assignment]
