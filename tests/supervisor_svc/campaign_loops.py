"""A stand-in for the campaign loop, for tests of the campaign API: it only says where it is, then waits.

Each loop it makes reports the THINK phase of the next cycle, announces its handle on `started`,
and waits until `release` is set (or it is cancelled). The test drives the campaign through the
handles it got.
"""

from __future__ import annotations

import asyncio

from supervisor_svc.campaigns.model import Phase
from supervisor_svc.campaigns.service import CampaignHandle, CampaignLoop


class WaitingLoops:
    def __init__(self) -> None:
        self.started: asyncio.Queue[CampaignHandle] = asyncio.Queue()
        self.release = asyncio.Event()
        self.cancelled: list[str] = []

    def __call__(self, handle: CampaignHandle) -> CampaignLoop:
        return _WaitingLoop(self, handle)

    async def next_started(self, within: float = 10.0) -> CampaignHandle:
        return await asyncio.wait_for(self.started.get(), within)


class _WaitingLoop:
    def __init__(self, loops: WaitingLoops, handle: CampaignHandle) -> None:
        self._loops = loops
        self._handle = handle

    async def run(self) -> None:
        handle = self._handle
        await handle.set_phase(Phase.THINK, handle.record.cycle + 1, "thinking")
        self._loops.started.put_nowait(handle)
        try:
            await self._loops.release.wait()
        except asyncio.CancelledError:
            self._loops.cancelled.append(handle.campaign_id)
            raise
