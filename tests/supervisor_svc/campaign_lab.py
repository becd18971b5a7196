"""The lab the campaign loop's process tests run on: scratchpad, monitor, an engineer worker and the supervisor
(its real loop, wired by build_host from the monitor's address) in this process, a scripted model, and a tiny CPU
"training" script in a temporary git workspace: gradient descent on (x - 3)^2 whose learning rate and steps live
in config.json, printing its validation loss with a little noise. Also on an SSH host (and its Slurm).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor_svc.service import build_host as build_monitor
from quarry.clients.campaigns import CampaignsClient
from quarry.clients.channels import open_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import MonitorSettings, QuarrySettings, ScratchpadSettings, SupervisorSettings, WorkerSettings
from quarry.identity import MeshRole, Role
from quarry.mesh import MeshKeys
from quarry.v1 import campaign_pb2, monitor_pb2
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.campaigns.think import INSTRUCTIONS
from supervisor_svc.service import build_host as build_supervisor
from tests.conftest import TEST_API_KEY, ServiceProcess, reusable_port, start_service, stop_service
from tests.fakes.choreography import Choreography, agent_of
from tests.fakes.openai_server import Call, HttpError, Reply, ScriptedModel, Step
from tests.hosts.openssh import openssh_host
from tests.hosts.slurm import SlurmCluster, slurm_cluster
from worker_svc.roles import ROLES
from worker_svc.service import build_host as build_worker

TRAIN = """\
import json, random, time

config = json.load(open("config.json"))
x = 0.0
for step in range(config["steps"]):
    x -= config["lr"] * 2 * (x - 3.0)  # gradient descent on (x - 3)^2
time.sleep(config.get("sleep", 0.5))
print(f"val_loss={(x - 3.0) ** 2 + random.uniform(0, 0.002):.6f}", flush=True)
"""
BASELINE_CONFIG = '{"lr": 0.01, "steps": 20}\n'  # val_loss about 4.0
BETTER_CONFIG = '{"lr": 0.1, "steps": 20}\n'  # about 0.0013: far beyond the noise
WORSE_CONFIG = '{"lr": 0.001, "steps": 20}\n'  # about 8.6
BROKEN_CONFIG = '{"lr": 0.1, "steps": \n'  # the script crashes reading it
DIRECTIVE = "Try a larger learning rate first."
LEADER = INSTRUCTIONS.split("\n", 1)[0]
WRITER = ROLES[Role.WRITER].instructions[:80]
# A scripted turn: a reply, or one made from the request (what a tool answered, the ledger's figures).
ScriptStep = Step | Callable[[dict[str, Any]], Step]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_project(roots: Path) -> Path:
    project = roots / "project"
    project.mkdir(parents=True)
    (project / "train.py").write_text(TRAIN)
    (project / "config.json").write_text(BASELINE_CONFIG)
    (project / "train.sh").write_text(f"#!/bin/sh\nexec {sys.executable} train.py\n")  # what Slurm runs
    git(project, "init", "-q", "-b", "main")
    git(project, "-c", "user.name=T", "-c", "user.email=t@example.com", "add", "-A")
    git(project, "-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-q", "-m", "initial")
    return project.resolve()


@dataclass
class Script:
    """The leader's and the engineer's turns, told apart by the leader's instructions, and any researcher's, by its
    task's objective; each request's time."""

    leader: deque[ScriptStep] = field(default_factory=deque)
    engineer: deque[ScriptStep] = field(default_factory=deque)
    writer: deque[ScriptStep] = field(default_factory=deque)
    writer_requests: list[dict[str, Any]] = field(default_factory=list)
    researchers: Choreography = field(default_factory=Choreography)
    leader_requests: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> Step:
        self.times.append(time.time())
        if LEADER in (body["messages"][0].get("content") or ""):
            self.leader_requests.append(body)
            queue = self.leader
        elif agent_of(body) in self.researchers.scripts:
            return self.researchers(body)
        elif WRITER in (body["messages"][0].get("content") or ""):
            self.writer_requests.append(body)
            queue = self.writer
        else:
            queue = self.engineer
        if not queue:
            return HttpError(400, message="no script left")
        step = queue.popleft()
        return step(body) if callable(step) else step

    def cycle(self, change: str, config: str, hypothesis: str) -> None:
        self.leader.extend(
            [
                Reply(calls=(Call("delegate_engineer", {"change": change}, f"e-{len(self.leader)}"),)),
                Reply(content=hypothesis),
            ]
        )
        self.engineer.extend(
            [
                Reply(calls=(Call("write_file", {"path": "config.json", "content": config}, "w"),)),
                Reply(content=f"config.json now says {config.strip()}"),
            ]
        )


@dataclass
class Lab:
    project: Path
    campaigns: CampaignsClient
    scratchpad: ScratchpadClient
    script: Script
    restart: Callable[[], Awaitable[None]]
    monitor_address: str = ""


@contextlib.asynccontextmanager
async def open_lab(
    tmp_path: Path, model: ScriptedModel, project: Path, monitor_settings: MonitorSettings, web: str = ""
) -> AsyncIterator[Lab]:
    """Scratchpad, a monitor with these settings, an engineer worker and the supervisor, for a campaign on
    `project`; `web`: the loopback HOST:PORT the worker may read pages from (a fixture web)."""
    script = Script()
    model.default = script
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1)
    async with (
        await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common) as scratchpad,
        await build_monitor(monitor_settings, common) as monitor,
    ):
        worker = await build_worker(
            WorkerSettings(
                address="127.0.0.1:0",
                database_url=f"sqlite:///{tmp_path / 'worker.db'}",
                scratchpad_address=scratchpad.address,
                monitor_address=monitor.address,
                model_base_url=model.base_url,
                model_name="scripted",
                fetch_allow=web,
            ),
            common,
        )
        async with worker, contextlib.AsyncExitStack() as stack:
            settings = SupervisorSettings(
                address=f"127.0.0.1:{reusable_port()}",
                database_url=f"sqlite:///{tmp_path / 'supervisor.db'}",
                scratchpad_address=scratchpad.address,
                worker_addresses=worker.address,
                monitor_address=monitor.address,
                model_base_url=model.base_url,
                model_name="scripted",
            )
            supervisor = await stack.enter_async_context(await build_supervisor(settings, common))

            async def restart() -> None:
                """Stop the supervisor (its loops stop where they are) and start another on its database."""
                nonlocal supervisor
                await supervisor.__aexit__(None, None, None)
                supervisor = await build_supervisor(settings, common)
                await supervisor.__aenter__()

            try:
                async with (
                    open_channel(settings.address, token=TEST_API_KEY) as channel,
                    open_channel(scratchpad.address) as scratchpad_channel,
                ):
                    yield Lab(
                        project,
                        CampaignsClient(channel),
                        ScratchpadClient(scratchpad_channel),
                        script,
                        restart,
                        monitor.address,
                    )
            finally:
                await supervisor.__aexit__(None, None, None)


def spec(project: Path, cycles: int) -> campaign_pb2.CampaignSpec:
    message = campaign_pb2.CampaignSpec(
        title="tiny",
        brief=campaign_pb2.CampaignBrief(goal="Lower the validation loss.", protected_paths=["train.py"]),
        workspace=campaign_pb2.CampaignWorkspace(root=str(project)),
        metric=monitor_pb2.MetricSpec(
            name="val_loss", direction=monitor_pb2.METRIC_DIRECTION_MINIMIZE, log_regex=r"val_loss=([0-9.]+)"
        ),
        experiment=campaign_pb2.CampaignExperiment(argv=[sys.executable, "train.py"]),
        budgets=campaign_pb2.CampaignBudgets(max_cycles=cycles),
    )
    message.experiment.wall_clock_limit.FromSeconds(60)
    return message


KEEP = campaign_pb2.LEDGER_VERDICT_KEEP
DISCARD = campaign_pb2.LEDGER_VERDICT_DISCARD
FAILED = campaign_pb2.LEDGER_VERDICT_FAILED
BASELINE = campaign_pb2.LEDGER_VERDICT_BASELINE
RETEST = campaign_pb2.LEDGER_VERDICT_RETEST


@dataclass
class Ran:
    """A campaign run to its end: its events and its ledger rows."""

    campaign_id: str
    stream: list[campaign_pb2.CampaignEvent]
    rows: list[campaign_pb2.LedgerRow]


async def run_campaign(lab: Lab, message: campaign_pb2.CampaignSpec, request_id: str, *directives: str) -> Ran:
    campaign = await lab.campaigns.start_campaign(message, request_id=request_id)
    for index, directive in enumerate(directives, 1):
        await lab.campaigns.send_directive(campaign.campaign_id, directive, request_id=f"directive-{index}")
    stream: list[campaign_pb2.CampaignEvent] = []
    async for event in lab.campaigns.stream_campaign(campaign.campaign_id):
        stream.append(event)
        # A paused campaign's stream goes on until someone resumes it: here that is a failure, said at once.
        assert not event.HasField("paused"), event.paused.reason
    assert stream[-1].ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED, stream[-1].ended.reason
    rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
    return Ran(campaign.campaign_id, stream, rows)


def script_keep_then_discard(script: Script) -> None:
    """The happy path's two THINKs: an improvement far beyond the noise, then a regression."""
    script.cycle("Set lr to 0.1 in config.json.", BETTER_CONFIG, "A larger learning rate converges faster.")
    script.cycle("Set lr to 0.001 in config.json.", WORSE_CONFIG, "A smaller learning rate is more stable.")


def assert_measured_kept_and_discarded(project: Path, ran: Ran, initial: str) -> None:
    """The happy path's five cycles: the unchanged baseline three times, the improvement kept (its commit on the
    campaign's branch), the regression discarded (the workspace back at the kept commit, file and HEAD)."""
    rows = ran.rows
    assert [row.verdict for row in rows[:5]] == [BASELINE, BASELINE, BASELINE, KEEP, DISCARD]
    kept, discarded = rows[3], rows[4]
    assert {row.commit for row in rows[:3]} == {initial}
    assert all(3.9 < row.metrics[0].value < 4.1 for row in rows[:3])
    assert kept.metrics[0].value < 0.01 and discarded.metrics[0].value > 8
    assert git(project, "rev-parse", "--abbrev-ref", "HEAD") == f"quarry/{ran.campaign_id}"
    assert git(project, "rev-parse", "HEAD") == kept.commit
    assert git(project, "show", f"{kept.commit}:config.json") + "\n" == BETTER_CONFIG
    assert (project / "config.json").read_text() == BETTER_CONFIG
    assert discarded.commit not in {initial, kept.commit}
    assert git(project, "show", f"{discarded.commit}:config.json") + "\n" == WORSE_CONFIG


# -- the happy path on an SSH host, and through Slurm --------------------------------------------------


@contextlib.asynccontextmanager
async def remote_lab(
    tmp_path: Path, model: ScriptedModel, *, slurm: bool = False
) -> AsyncIterator[tuple[Lab, SlurmCluster | None]]:
    """The lab with its workspace on the SSH host gpu1, a real OpenSSH server on loopback (tests/hosts): the
    monitor opens and edits it over SSH and runs its jobs there, their logs under the host's log root; with
    `slurm`, the host is the login node of a real single-node Slurm cluster."""
    project = make_project(tmp_path / "roots")
    (tmp_path / "logs").mkdir()  # the host's log root
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(slurm_cluster(tmp_path / "slurm")) if slurm else None
        ssh = stack.enter_context(openssh_host(tmp_path / "ssh", cluster.environment if cluster else None))
        settings = ssh.settings(
            log_roots=[str(tmp_path / "logs")], workspace_roots=[str(project.parent)], job_poll_seconds=0.2
        )
        async with open_lab(tmp_path, model, project, settings) as opened:
            yield opened, cluster


def on_the_host(project: Path) -> campaign_pb2.CampaignSpec:
    message = spec(project, cycles=5)
    message.workspace.host = "gpu1"
    return message


def jobs_by_cycle(ran: Ran) -> dict[int, monitor_pb2.JobRef]:
    return {event.job_progress.cycle: event.job_progress.job for event in ran.stream if event.HasField("job_progress")}


def assert_each_metric_is_the_monitors_reading_of_the_jobs_log(ran: Ran, log_root: Path) -> None:
    """Each cycle's value is what its job printed in its log on the host, as the monitor read it."""
    for row in ran.rows:
        printed = re.findall(r"val_loss=([0-9.]+)", (log_root / f"{row.job_id}.log").read_text())
        assert [float(value) for value in printed] == [row.metrics[0].value], row.cycle


# -- the lab as `quarry serve` processes ---------------------------------------------------------------


@dataclass
class ProcessLab:
    """Scratchpad, monitor, an engineer worker and the supervisor as `quarry serve` processes with mesh tokens;
    `start` starts one again (on its database) with the environment it had."""

    tmp_path: Path
    keys: MeshKeys
    environments: dict[str, tuple[dict[str, str], MeshRole | None]] = field(default_factory=dict)
    started: list[ServiceProcess] = field(default_factory=list)
    services: dict[str, ServiceProcess] = field(default_factory=dict)

    def start(self, name: str, *, port: int = 0) -> ServiceProcess:
        env, role = self.environments[name]
        service = start_service(name, {**env, **self.keys.environment(role)}, self.tmp_path, port=port)
        self.started.append(service)
        self.services[name] = service
        return service


@contextlib.asynccontextmanager
async def process_lab(
    tmp_path: Path,
    model: ScriptedModel,
    roots: Path,
    extra: dict[str, str] | None = None,
    monitor_extra: dict[str, str] | None = None,
) -> AsyncIterator[ProcessLab]:
    """The four services started in order, each told the addresses of those before it; all stopped (SIGTERM)
    on the way out. `extra` is every service's environment, `monitor_extra` the monitor's (its SSH hosts)."""
    lab = ProcessLab(tmp_path, MeshKeys.generate())
    common = {"QUARRY_DATA_DIR": str(tmp_path / "data"), "QUARRY_LOG_LEVEL": "WARNING", **(extra or {})}
    model_env = {"QUARRY_MODEL_BASE_URL": model.base_url, "QUARRY_MODEL_NAME": "scripted"}
    try:
        lab.environments["scratchpad"] = (common, None)
        scratchpad = await asyncio.to_thread(lab.start, "scratchpad")
        monitor_env = {
            **common,
            "QUARRY_MONITOR_ALLOW_JOB_SUBMISSION": "true",
            "QUARRY_MONITOR_WORKSPACE_ROOTS": json.dumps([str(roots)]),
            "QUARRY_MONITOR_JOB_POLL_SECONDS": "0.2",
            **(monitor_extra or {}),
        }
        lab.environments["monitor"] = (monitor_env, None)
        monitor = await asyncio.to_thread(lab.start, "monitor")
        worker_env = {
            **common,
            **model_env,
            "QUARRY_WORKER_DATABASE_URL": f"sqlite:///{tmp_path / 'worker.db'}",
            "QUARRY_WORKER_SCRATCHPAD_ADDRESS": scratchpad.address,
            "QUARRY_WORKER_MONITOR_ADDRESS": monitor.address,
        }
        lab.environments["worker"] = (worker_env, MeshRole.WORKER)
        worker = await asyncio.to_thread(lab.start, "worker")
        lab.environments["supervisor"] = (
            {
                **common,
                **model_env,
                "QUARRY_SUPERVISOR_DATABASE_URL": f"sqlite:///{tmp_path / 'supervisor.db'}",
                "QUARRY_SUPERVISOR_SCRATCHPAD_ADDRESS": scratchpad.address,
                "QUARRY_SUPERVISOR_WORKER_ADDRESSES": worker.address,
                "QUARRY_SUPERVISOR_MONITOR_ADDRESS": monitor.address,
                "QUARRY_SUPERVISOR_RUN_LEASE_SECONDS": "2",
            },
            MeshRole.SUPERVISOR,
        )
        await asyncio.to_thread(lab.start, "supervisor")
        yield lab
    finally:
        for service in reversed(lab.started):
            stop_service(service)
