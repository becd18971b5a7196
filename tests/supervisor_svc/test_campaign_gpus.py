"""Several campaigns on one host share its GPUs, over real gRPC on the lab of campaign_lab.py.

The host has two GPUs (NVML is the one thing faked: tests/monitor_svc/test_gpus.py's module, as a machine without
the driver must). Three campaigns each ask for one GPU per experiment: the monitor's reservations decide, the third
waits saying why, and runs when a GPU frees. Afterwards the monitor's job records show that no two jobs ever held
the same GPU at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quarry.config import MonitorSettings
from quarry.v1 import campaign_pb2
from tests.fakes.openai_server import ScriptedModel
from tests.monitor_svc.test_gpus import fake_nvml
from tests.supervisor_svc.campaign_lab import BASELINE, Lab, git, make_project, open_lab, spec

pytestmark = pytest.mark.slow

CAMPAIGNS = 3
SLOW_BASELINE = '{"lr": 0.01, "steps": 20, "sleep": 1.0}\n'


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


@pytest.fixture
async def shared_lab(tmp_path: Path, model: ScriptedModel, two_gpus: types.ModuleType) -> AsyncIterator[Lab]:
    roots = tmp_path / "roots"
    for index in range(CAMPAIGNS):
        project = make_project(roots / f"p{index}")
        (project / "config.json").write_text(SLOW_BASELINE)  # each job holds its GPU a second
        git(project, "-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-qam", "slower")
    settings = MonitorSettings(
        address="127.0.0.1:0",
        allow_job_submission=True,
        workspace_roots=[str(roots.resolve())],
        job_poll_seconds=0.2,
    )
    async with open_lab(tmp_path, model, roots / "p0" / "project", settings) as opened:
        yield opened


def one_gpu_campaign(project: Path) -> campaign_pb2.CampaignSpec:
    message = spec(project, cycles=2)
    message.signals.CopyFrom(campaign_pb2.CampaignSignalRules(baseline_runs=2))  # two jobs each, no model call
    message.experiment.gpus.count = 1
    return message


async def test_three_campaigns_on_a_two_gpu_host_never_share_a_gpu_and_the_third_waits_saying_why(
    shared_lab: Lab, tmp_path: Path
) -> None:
    lab = shared_lab
    started = [
        await lab.campaigns.start_campaign(
            one_gpu_campaign(tmp_path / "roots" / f"p{index}" / "project"), request_id=f"gpus-{index}"
        )
        for index in range(CAMPAIGNS)
    ]

    async def follow(campaign_id: str) -> list[campaign_pb2.CampaignEvent]:
        return [event async for event in lab.campaigns.stream_campaign(campaign_id)]

    streams = await asyncio.wait_for(asyncio.gather(*(follow(c.campaign_id) for c in started)), 120)

    for stream in streams:
        assert stream[-1].ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED, stream[-1].ended.reason
        rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
        assert [row.verdict for row in rows] == [BASELINE, BASELINE]
    # Some campaign found both GPUs taken, and said so while it waited.
    waits = [
        event.phase_changed.message
        for stream in streams
        for event in stream
        if event.HasField("phase_changed") and event.phase_changed.message.startswith("waiting for a GPU")
    ]
    assert waits and all("0 of the 2 GPU(s)" in message for message in waits), waits
    # The monitor's own records: six jobs of one GPU each, and no two on one GPU at the same time.
    records = [json.loads(path.read_text()) for path in (tmp_path / "monitor" / "jobs").glob("job-*.json")]
    assert len(records) == 2 * CAMPAIGNS and all(len(record["gpus"]) == 1 for record in records)
    for gpu in (0, 1):
        spans = sorted((r["started_at"], r["ended_at"]) for r in records if r["gpus"] == [gpu])
        assert spans, f"GPU {gpu} ran nothing"
        for (_, ended), (next_started, _) in itertools.pairwise(spans):
            assert ended <= next_started, f"two jobs held GPU {gpu} at once: {spans}"
