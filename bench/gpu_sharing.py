"""GPU sharing benchmark: how long a GPU stays idle between one campaign's job and the next waiting campaign's.

    python3 bench/gpu_sharing.py [--campaigns 3] [--job-seconds 2] [--rounds 5]

The services run as `quarry serve` processes (bench/campaign.py's). The monitor's machine has one GPU: NVML is the
one thing stood in for (a `pynvml` module on the monitor's PYTHONPATH reporting one device), as a machine without
the NVIDIA driver must. Each round starts `campaigns` campaigns at once, each of two baseline runs of a job that
holds the GPU `job_seconds` (no model call), so all but one wait for the GPU at any time. From the monitor's own job
records: each hand-over's gap is the next job's start minus the previous job's end as the monitor recorded it
(the moment it saw the job end, its reservation freed); and whether two jobs ever held the GPU at once (must be 0).
Prints the hand-overs of each round and the figures, as the median (range) over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
from pathlib import Path

from campaign import make_project, services, spec
from harness import arguments, percentile
from rounds import MIN_ROUNDS, Rounds

from quarry.clients.campaigns import CampaignsClient
from quarry.v1 import campaign_pb2
from tests.fakes.openai_server import HttpError, ScriptedModel

# One NVIDIA device, as nvidia-ml-py reports it; only what the monitor reads.
FAKE_NVML = """
class NVMLError(Exception): pass
class NVMLError_NotSupported(NVMLError): pass
class _Memory: total, used = 80 * 2**30, 0
class _Rates: gpu = 0
NVML_TEMPERATURE_GPU = 0
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(index): return index
def nvmlDeviceGetUUID(handle): return "GPU-bench-0"
def nvmlDeviceGetName(handle): return "Bench GPU"
def nvmlDeviceGetMemoryInfo(handle): return _Memory()
def nvmlDeviceGetUtilizationRates(handle): return _Rates()
def nvmlDeviceGetTemperature(handle, sensor): return 40
def nvmlDeviceGetPowerUsage(handle): return 50000
def nvmlDeviceGetComputeRunningProcesses(handle): return []
"""


def one_gpu(project: Path, job_seconds: int) -> campaign_pb2.CampaignSpec:
    message = spec(project, 2, job_seconds)  # the two baseline runs only: no model call
    message.experiment.gpus.count = 1
    return message


async def main_async(args: argparse.Namespace) -> None:
    rounds = Rounds("gpu_sharing", args.rounds)
    async with ScriptedModel() as model:
        model.default = lambda body: HttpError(400, message="a baseline calls no model")
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            roots = (workdir / "roots").resolve()
            roots.mkdir()
            nvml = workdir / "nvml"
            nvml.mkdir()
            (nvml / "pynvml.py").write_text(FAKE_NVML)
            with services(workdir, roots, model, {"PYTHONPATH": str(nvml)}) as supervisor:
                async with CampaignsClient.connect(supervisor) as campaigns:
                    for index in rounds:
                        started = [
                            await campaigns.start_campaign(
                                one_gpu(make_project(roots / f"r{index}-c{n}", args.job_seconds), args.job_seconds),
                                request_id=f"gpus-{index}-{n}",
                            )
                            for n in range(args.campaigns)
                        ]
                        ended = await asyncio.gather(*(follow(campaigns, c.campaign_id) for c in started))
                        for event in ended:
                            if event.ended.state != campaign_pb2.CAMPAIGN_STATE_COMPLETED:
                                raise SystemExit(f"a campaign ended {event.ended.reason}")
                        measure(rounds, workdir / "data" / "monitor" / "jobs", {c.campaign_id for c in started})
    print(f"{args.campaigns} campaigns of 2 jobs of {args.job_seconds} s on one GPU")
    rounds.report()


async def follow(campaigns: CampaignsClient, campaign_id: str) -> campaign_pb2.CampaignEvent:
    last = None
    async for event in campaigns.stream_campaign(campaign_id):
        last = event
    assert last is not None
    return last


def measure(rounds: Rounds, records: Path, campaign_ids: set[str]) -> None:
    jobs = [json.loads(path.read_text()) for path in records.glob("job-*.json")]
    jobs = sorted(
        (job for job in jobs if job["request_id"].split("/")[0] in campaign_ids), key=lambda job: job["started_at"]
    )
    gaps = [after["started_at"] - before["ended_at"] for before, after in itertools.pairwise(jobs)]
    overlaps = sum(1 for gap in gaps if gap < 0)
    print("hand-over gaps (s):", " ".join(f"{gap:.2f}" for gap in gaps))
    rounds.record("GPU idle between jobs p50", percentile(gaps, 0.5), "s")
    rounds.record("GPU idle between jobs max", max(gaps), "s")
    rounds.record("jobs holding the GPU at once (must be 0)", overlaps)


def main() -> None:
    asyncio.run(main_async(arguments(__doc__, campaigns=3, job_seconds=2, rounds=MIN_ROUNDS)))


if __name__ == "__main__":
    main()
