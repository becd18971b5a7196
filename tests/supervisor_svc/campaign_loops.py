"""A stand-in for the campaign loop, for tests of the campaign API: it only says where it is, then waits.

Each loop it makes reports the THINK phase of the next cycle, announces its handle on `started`,
and waits until `release` is set (or it is cancelled). The test drives the campaign through the
handles it got. `serve_campaigns` runs the supervisor's host in this process with such loops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from quarry.clients.campaigns import CampaignsClient
from quarry.clients.channels import open_channel
from quarry.config import QuarrySettings, SupervisorSettings
from quarry.server import ServiceHost
from quarry.v1 import campaign_pb2, monitor_pb2
from supervisor_svc.campaigns.service import CampaignHandle, CampaignLoop
from supervisor_svc.campaigns.state import Phase
from supervisor_svc.service import build_host as build_supervisor
from tests.conftest import TEST_API_KEY, reusable_port
from tests.fakes.openai_server import ScriptedModel


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


def campaign_spec(goal: str = "Lower the validation loss.") -> campaign_pb2.CampaignSpec:
    message = campaign_pb2.CampaignSpec(
        title="tiny",
        brief=campaign_pb2.CampaignBrief(goal=goal, protected_paths=["eval.py"]),
        workspace=campaign_pb2.CampaignWorkspace(root="/srv/workspace"),
        metric=monitor_pb2.MetricSpec(
            name="val_loss", direction=monitor_pb2.METRIC_DIRECTION_MINIMIZE, log_regex=r"val_loss=(\S+)"
        ),
        experiment=campaign_pb2.CampaignExperiment(command_line="python3 train.py --config 'a b.toml'"),
    )
    message.experiment.wall_clock_limit.FromSeconds(300)
    return message


@dataclass
class ServedCampaigns:
    host: ServiceHost
    client: CampaignsClient
    loops: WaitingLoops

    async def events(self, campaign_id: str, after: int = 0) -> list[campaign_pb2.CampaignEvent]:
        return [event async for event in self.client.stream_campaign(campaign_id, after_sequence_no=after)]


@contextlib.asynccontextmanager
async def serve_campaigns(tmp_path: Path, database_url: str, model: ScriptedModel) -> AsyncIterator[ServedCampaigns]:
    """The supervisor's host (its campaigns driven by WaitingLoops) and a client of its campaign API."""
    loops = WaitingLoops()
    settings = SupervisorSettings(
        address="127.0.0.1:0",
        database_url=database_url,
        scratchpad_address=f"127.0.0.1:{reusable_port()}",  # campaigns here never reach it
        worker_addresses=f"127.0.0.1:{reusable_port()}",
        model_base_url=model.base_url,
        model_name="scripted",
    )
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1)
    host = await build_supervisor(settings, common, campaign_loop=loops)
    try:
        async with host, open_channel(host.address, token=TEST_API_KEY) as channel:
            yield ServedCampaigns(host, CampaignsClient(channel), loops)
    finally:
        loops.release.set()
