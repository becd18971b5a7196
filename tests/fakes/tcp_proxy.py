"""A TCP forwarder on 127.0.0.1 that a test can cut and restore: a database outage without stopping the
database (other tests share it). Cut, it closes every connection it carries and refuses new ones (they are
accepted and closed at once, as a server that is restarting does). Served from another thread
(`served_in_thread`) when the code under test blocks the test's loop; `cut` and `restore` may be called from
any thread."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from tests.fakes.loopback import Served


class TcpProxy(Served):
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.up = True
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        """The outage begins: every carried connection is closed, and new ones are closed at once."""
        self._on_loop(self._cut)

    def restore(self) -> None:
        self._on_loop(lambda: setattr(self, "up", True))

    def _cut(self) -> None:
        self.up = False
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def _on_loop(self, change: Callable[[], None]) -> None:
        """Make the change on the proxy's loop, and return once it is made."""
        assert self._loop is not None, "not started"
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            change()
            return

        async def made() -> None:
            change()

        asyncio.run_coroutine_threadsafe(made(), self._loop).result(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, upstream_writer))
        try:
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        finally:
            for end in (writer, upstream_writer):
                self._writers.discard(end)
                end.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()
