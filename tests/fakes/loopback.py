"""What the fake HTTP servers share: serving an aiohttp app on 127.0.0.1, and `async with` to start and stop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Self, TypeVar

from aiohttp import web


async def serve_on_loopback(app: web.Application) -> tuple[web.AppRunner, int]:
    """Serve `app` on 127.0.0.1 on a port the kernel picks; returns the runner (to clean up) and the port."""
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port: int = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


class Served:
    """`async with server:` starts it and stops it however the block ends."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.stop()


S = TypeVar("S", bound=Served)


@contextmanager
def served_in_thread(server: S) -> Iterator[S]:
    """Serve `server` from an event loop in a thread of its own, so that it outlives each test's loop: the
    tests of a module that share one process mesh share the fake servers it calls too."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name=f"served-{type(server).__name__}", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
        try:
            yield server
        finally:
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
