"""A served service keeps the garbage collector off what it built while starting."""

from __future__ import annotations

import asyncio
import contextlib
import gc

from quarry.server import ServiceHost, serve_until_signalled


async def test_serving_freezes_what_the_service_built_while_starting() -> None:
    gc.unfreeze()
    built_at_start = [object()]
    host = ServiceHost("127.0.0.1:0", [])
    serving = asyncio.create_task(serve_until_signalled(host))
    try:
        await host.wait_started()
        assert gc.get_freeze_count() > 0
        # What the service built is in the permanent generation: no collection will scan it again.
        assert not any(collected is built_at_start for collected in gc.get_objects())
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        gc.unfreeze()
