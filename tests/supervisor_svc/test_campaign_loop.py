"""The campaign loop end to end over real gRPC: scratchpad, monitor, an engineer worker and the supervisor (its
real loop, wired by build_host from the monitor's address) in this process, a scripted model, and a tiny CPU
"training" script in a temporary git workspace: gradient descent on (x - 3)^2 whose learning rate and steps live
in config.json, printing its validation loss with a little noise.

One campaign of six cycles: the unchanged baseline three times (the noise floor), an improvement beyond the noise
kept (its commit stays on the campaign's branch), a regression discarded (the workspace back at the kept commit,
file and HEAD), a crashing experiment recorded FAILED with a dead end and no metric; a directive read by one
THINK only; and no model call while any job ran. Then: a supervisor restarted mid-experiment (in this process,
and SIGKILLed as a process among `quarry serve` processes) finds the job again; a retest inside the noise;
stagnation and the phase gate; the limiter's sleep.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from monitor_svc.service import build_host as build_monitor
from quarry.client import CampaignClient, ScratchpadClient, open_channel
from quarry.config import MonitorSettings, QuarrySettings, ScratchpadSettings, SupervisorSettings, WorkerSettings
from quarry.identity import MeshRole
from quarry.mesh import MeshKeys
from quarry.v1 import campaign_pb2, monitor_pb2, scratchpad_pb2
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.campaigns.think import INSTRUCTIONS
from supervisor_svc.service import build_host as build_supervisor
from tests.conftest import ServiceProcess, reusable_port, start_service, stop_service
from tests.fakes.choreography import Choreography, agent_of
from tests.fakes.openai_server import Await, Call, HttpError, Reply, ScriptedModel, Step
from tests.monitor_svc.fake_ssh import FakeHost, fake_ssh_host
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


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_project(roots: Path) -> Path:
    project = roots / "project"
    project.mkdir(parents=True)
    (project / "train.py").write_text(TRAIN)
    (project / "config.json").write_text(BASELINE_CONFIG)
    (project / "train.sh").write_text(f"exec {sys.executable} train.py\n")  # what a campaign through Slurm submits
    git(project, "init", "-q", "-b", "main")
    git(project, "-c", "user.name=T", "-c", "user.email=t@example.com", "add", "-A")
    git(project, "-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-q", "-m", "initial")
    return project.resolve()


@dataclass
class Script:
    """The leader's and the engineer's turns, told apart by the leader's instructions, and any researcher's, by its
    task's objective; each request's time."""

    leader: deque[Step] = field(default_factory=deque)
    engineer: deque[Step] = field(default_factory=deque)
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
        else:
            queue = self.engineer
        return queue.popleft() if queue else HttpError(400, message="no script left")

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
    campaigns: CampaignClient
    scratchpad: ScratchpadClient
    script: Script
    restart: Callable[[], Awaitable[None]]


@pytest.fixture
async def lab(tmp_path: Path, model: ScriptedModel) -> AsyncIterator[Lab]:
    roots = tmp_path / "roots"
    project = make_project(roots)
    monitor_settings = MonitorSettings(
        address="127.0.0.1:0", allow_job_submission=True, workspace_roots=[str(roots.resolve())]
    )
    async with open_lab(tmp_path, model, project, monitor_settings) as opened:
        yield opened


@contextlib.asynccontextmanager
async def open_lab(
    tmp_path: Path, model: ScriptedModel, project: Path, monitor_settings: MonitorSettings
) -> AsyncIterator[Lab]:
    """Scratchpad, a monitor with these settings, an engineer worker and the supervisor, for a campaign on
    `project`."""
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
                    open_channel(settings.address) as channel,
                    open_channel(scratchpad.address) as scratchpad_channel,
                ):
                    yield Lab(project, CampaignClient(channel), ScratchpadClient(scratchpad_channel), script, restart)
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
    stream = [event async for event in lab.campaigns.stream_campaign(campaign.campaign_id)]
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


async def test_a_campaign_measures_keeps_discards_and_fails_by_code_with_no_model_call_while_a_job_runs(
    lab: Lab,
) -> None:
    script, project = lab.script, lab.project
    script_keep_then_discard(script)
    script.cycle("Make config.json say steps is nothing.", BROKEN_CONFIG, "Fewer steps save time.")
    initial = git(project, "rev-parse", "HEAD")

    ran = await run_campaign(lab, spec(project, cycles=6), "lab-1", DIRECTIVE)
    stream, rows = ran.stream, ran.rows
    assert [row.cycle for row in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[5].verdict == FAILED
    assert_measured_kept_and_discarded(project, ran, initial)
    kept, crashed = rows[3], rows[5]

    # The noise floor and the best come from the baseline, then the keep.
    final = await lab.campaigns.get_campaign(ran.campaign_id)
    assert final.best_value == pytest.approx(kept.metrics[0].value)
    signals = [event.signal for event in stream if event.HasField("signal")]
    assert [signal.kind for signal in signals] == [campaign_pb2.CAMPAIGN_SIGNAL_KIND_NOISE_FLOOR]
    assert signals[0].value == pytest.approx(final.noise_floor)
    assert 0 < signals[0].value < 0.01

    # The crash: FAILED by the job's exit, no metric, and a dead end on the campaign's thread.
    assert crashed.job_state == monitor_pb2.JOB_STATE_FAILED
    assert not crashed.metrics[0].HasField("value")
    entries = await lab.scratchpad.read_all(ran.campaign_id)
    dead_ends = [json.loads(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_CAMPAIGN_DEAD_END]
    assert [(d["cycle"], d["approach"]) for d in dead_ends] == [(6, "Fewer steps save time.")]
    ledger = [json.loads(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_CAMPAIGN_LEDGER]
    assert [record["cycle"] for record in ledger] == [1, 2, 3, 4, 5, 6]
    assert "Fewer steps save time." in (project / "DEAD_ENDS.md").read_text()
    assert len((project / "experiments.jsonl").read_text().splitlines()) == 6

    # The directive reached the first THINK only, and was consumed once.
    first_think, later_thinks = script.leader_requests[0], script.leader_requests[2:]
    assert DIRECTIVE in first_think["messages"][1]["content"]
    assert all(DIRECTIVE not in request["messages"][1]["content"] for request in later_thinks)
    consumed = [event.directive_consumed for event in stream if event.HasField("directive_consumed")]
    assert [(c.request_id, c.cycle) for c in consumed] == [("directive-1", 4)]

    # No model call while a job ran: between each cycle's WAITING and REFLECT phases, none arrived.
    waiting = {
        event.phase_changed.cycle: event.create_time.ToDatetime(tzinfo=UTC).timestamp()
        for event in stream
        if event.HasField("phase_changed") and event.phase_changed.phase == campaign_pb2.CAMPAIGN_PHASE_WAITING
    }
    reflecting = {
        event.phase_changed.cycle: event.create_time.ToDatetime(tzinfo=UTC).timestamp()
        for event in stream
        if event.HasField("phase_changed") and event.phase_changed.phase == campaign_pb2.CAMPAIGN_PHASE_REFLECT
    }
    assert sorted(waiting) == [1, 2, 3, 4, 5, 6]
    for cycle, start in waiting.items():
        assert not [moment for moment in script.times if start <= moment <= reflecting[cycle]], cycle
    assert len(script.times) == 12  # three cycles of two leader and two engineer turns


async def test_a_supervisor_restarted_during_a_running_experiment_finds_the_job_again_and_records_it_once(
    lab: Lab,
) -> None:
    slow = '{"lr": 0.1, "steps": 20, "sleep": 3}\n'
    lab.script.cycle("Set lr to 0.1 in config.json.", slow, "A larger learning rate converges faster.")
    campaign = await lab.campaigns.start_campaign(spec(lab.project, cycles=4), request_id="lab-restart")
    before: list[campaign_pb2.CampaignEvent] = []
    async for event in lab.campaigns.stream_campaign(campaign.campaign_id):
        before.append(event)
        changed = event.phase_changed
        if changed.cycle == 4 and changed.phase == campaign_pb2.CAMPAIGN_PHASE_WAITING:
            break
    job_id = before[-1].phase_changed.message.removeprefix("job ")

    await lab.restart()
    after = [
        e async for e in lab.campaigns.stream_campaign(campaign.campaign_id, after_sequence_no=before[-1].sequence_no)
    ]

    assert after[-1].ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED, after[-1].ended.reason
    rows = [event.ledger_recorded for event in [*before, *after] if event.HasField("ledger_recorded")]
    assert [row.cycle for row in rows] == [1, 2, 3, 4]
    assert rows[3].job_id == job_id and rows[3].verdict == KEEP
    # Re-attached, not thought out or launched again: the one THINK's two turns, and the same job.
    assert len(lab.script.leader_requests) == 2
    waits = [e.phase_changed.message for e in after if e.phase_changed.phase == campaign_pb2.CAMPAIGN_PHASE_WAITING]
    assert waits == [f"job {job_id}"]
    assert git(lab.project, "rev-parse", "HEAD") == rows[3].commit


async def test_a_think_interrupted_after_its_engineer_finished_is_redone_from_the_kept_state(lab: Lab) -> None:
    """The supervisor stops while the leader's last turn is pending, its engineer's change made but not committed:
    the THINK is redone (the workspace back at the kept commit), its engineer a new delegation that runs."""
    script = lab.script
    script.cycle("Set lr to 0.1 in config.json.", BETTER_CONFIG, "A larger learning rate converges faster.")
    held = asyncio.Event()
    script.leader[-1] = Await(held, then=script.leader[-1])
    campaign = await lab.campaigns.start_campaign(spec(lab.project, cycles=4), request_id="lab-redo")
    for _ in range(600):  # a minute at most
        if len(script.leader_requests) == 2:
            break
        await asyncio.sleep(0.1)
    assert len(script.leader_requests) == 2 and not script.engineer, "the engineer has made its change"
    assert (lab.project / "config.json").read_text() == BETTER_CONFIG

    await lab.restart()
    held.set()  # the first THINK's last turn is answered to nobody
    redo = Call("delegate_engineer", {"change": "Set lr to 0.1 in config.json."}, "e-redo")
    script.leader.extend([Reply(calls=(redo,)), Reply(content="A larger learning rate converges faster.")])
    script.engineer.extend(
        [
            Reply(calls=(Call("write_file", {"path": "config.json", "content": BETTER_CONFIG}, "w"),)),
            Reply(content="config.json now says lr 0.1"),
        ]
    )
    stream = [event async for event in lab.campaigns.stream_campaign(campaign.campaign_id)]

    assert stream[-1].ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED, stream[-1].ended.reason
    rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
    assert [(row.cycle, row.verdict) for row in rows] == [(1, BASELINE), (2, BASELINE), (3, BASELINE), (4, KEEP)]
    assert not script.engineer and len(script.leader_requests) == 4, "the redone THINK's engineer ran again"
    assert git(lab.project, "show", f"{rows[3].commit}:config.json") + "\n" == BETTER_CONFIG


async def test_over_processes_a_sigkilled_supervisor_is_restarted_and_its_campaign_runs_on_without_a_second_launch(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """Scratchpad, monitor, an engineer worker and the supervisor as `quarry serve` processes with mesh tokens;
    the supervisor SIGKILLed while cycle 4's experiment runs, then started again on its database."""
    script = Script()
    model.default = script
    slow = '{"lr": 0.1, "steps": 20, "sleep": 3}\n'
    script.cycle("Set lr to 0.1 in config.json.", slow, "A larger learning rate converges faster.")
    script.cycle("Set lr to 0.001 in config.json.", WORSE_CONFIG, "A smaller learning rate is more stable.")
    roots = (tmp_path / "roots").resolve()
    project = make_project(roots)
    keys = MeshKeys.generate()
    common = {"QUARRY_DATA_DIR": str(tmp_path / "data"), "QUARRY_LOG_LEVEL": "WARNING"}
    started: list[ServiceProcess] = []

    def start(name: str, env: dict[str, str], role: MeshRole | None) -> ServiceProcess:
        started.append(start_service(name, {**common, **keys.environment(role), **env}, tmp_path))
        return started[-1]

    try:
        scratchpad = await asyncio.to_thread(start, "scratchpad", {}, None)
        monitor_env = {
            "QUARRY_MONITOR_ALLOW_JOB_SUBMISSION": "true",
            "QUARRY_MONITOR_WORKSPACE_ROOTS": json.dumps([str(roots)]),
            "QUARRY_MONITOR_JOB_POLL_SECONDS": "0.2",
        }
        monitor = await asyncio.to_thread(start, "monitor", monitor_env, None)
        model_env = {"QUARRY_MODEL_BASE_URL": model.base_url, "QUARRY_MODEL_NAME": "scripted"}
        worker_env = {
            **model_env,
            "QUARRY_WORKER_DATABASE_URL": f"sqlite:///{tmp_path / 'worker.db'}",
            "QUARRY_WORKER_SCRATCHPAD_ADDRESS": scratchpad.address,
            "QUARRY_WORKER_MONITOR_ADDRESS": monitor.address,
        }
        worker = await asyncio.to_thread(start, "worker", worker_env, MeshRole.WORKER)
        supervisor_env = {
            **model_env,
            "QUARRY_SUPERVISOR_DATABASE_URL": f"sqlite:///{tmp_path / 'supervisor.db'}",
            "QUARRY_SUPERVISOR_SCRATCHPAD_ADDRESS": scratchpad.address,
            "QUARRY_SUPERVISOR_WORKER_ADDRESSES": worker.address,
            "QUARRY_SUPERVISOR_MONITOR_ADDRESS": monitor.address,
            "QUARRY_SUPERVISOR_RUN_LEASE_SECONDS": "2",
        }
        supervisor = await asyncio.to_thread(start, "supervisor", supervisor_env, MeshRole.SUPERVISOR)

        async with open_channel(supervisor.address) as channel:
            campaigns = CampaignClient(channel)
            campaign = await campaigns.start_campaign(spec(project, cycles=5), request_id="lab-processes")
            before: list[campaign_pb2.CampaignEvent] = []
            async for event in campaigns.stream_campaign(campaign.campaign_id):
                before.append(event)
                changed = event.phase_changed
                if changed.cycle == 4 and changed.phase == campaign_pb2.CAMPAIGN_PHASE_WAITING:
                    break
        job_id = before[-1].phase_changed.message.removeprefix("job ")
        supervisor.process.kill()  # SIGKILL: no lease given up, no loop told
        supervisor.process.wait()

        again = await asyncio.to_thread(start, "supervisor", supervisor_env, MeshRole.SUPERVISOR)
        async with open_channel(again.address) as channel:
            campaigns = CampaignClient(channel)
            after = [
                event
                async for event in campaigns.stream_campaign(
                    campaign.campaign_id, after_sequence_no=before[-1].sequence_no
                )
            ]
    finally:
        for service in reversed(started):
            stop_service(service)

    assert after[-1].ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED, after[-1].ended.reason
    rows = [event.ledger_recorded for event in [*before, *after] if event.HasField("ledger_recorded")]
    assert [row.cycle for row in rows] == [1, 2, 3, 4, 5]
    assert [row.verdict for row in rows] == [BASELINE, BASELINE, BASELINE, KEEP, DISCARD]
    assert rows[3].job_id == job_id
    # Cycle 4 was neither thought out nor launched again: two THINKs of two turns in all, one job for cycle 4.
    assert len(script.leader_requests) == 4
    waits = [e.phase_changed for e in after if e.phase_changed.phase == campaign_pb2.CAMPAIGN_PHASE_WAITING]
    assert (waits[0].cycle, waits[0].message) == (4, f"job {job_id}")
    assert git(project, "rev-parse", "HEAD") == rows[3].commit
    assert (project / "config.json").read_text() == slow


RETEST = campaign_pb2.LEDGER_VERDICT_RETEST


async def test_an_improvement_inside_the_noise_is_retested_without_thinking_then_discarded(lab: Lab) -> None:
    lab.script.cycle("Set lr to 0.1 in config.json.", BETTER_CONFIG, "A larger learning rate converges faster.")
    initial = git(lab.project, "rev-parse", "HEAD")
    message = spec(lab.project, cycles=5)
    # A floor of 10: a gain of about 4 is inside the noise, on one run and on the mean of three.
    message.signals.CopyFrom(campaign_pb2.CampaignSignalRules(baseline_runs=2, noise_epsilon=10.0))
    campaign = await lab.campaigns.start_campaign(message, request_id="lab-retest")
    stream = [event async for event in lab.campaigns.stream_campaign(campaign.campaign_id)]

    rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
    assert [row.verdict for row in rows] == [BASELINE, BASELINE, RETEST, RETEST, DISCARD]
    assert len({row.commit for row in rows[2:]}) == 1 and rows[2].commit != initial
    assert len(lab.script.leader_requests) == 2  # one THINK; the retests ran the same commit again
    assert len({row.job_id for row in rows}) == 5
    assert git(lab.project, "rev-parse", "HEAD") == initial
    assert (lab.project / "config.json").read_text() == BASELINE_CONFIG


RESEARCH = "Which learning rates converge fastest for gradient descent on a quadratic?"
RESEARCH_SUMMARY = "A larger step converges faster, up to 1/L."


async def test_a_leader_has_the_literature_researched_then_the_engineer_makes_the_change_and_it_is_run(
    lab: Lab,
) -> None:
    script = lab.script
    script.leader.extend(
        [
            Reply(calls=(Call("delegate_research", {"objective": RESEARCH, "criteria": ["cite a step size"]}, "r"),)),
            Reply(calls=(Call("delegate_engineer", {"change": "Set lr to 0.1 in config.json."}, "e"),)),
            Reply(content="A larger learning rate converges faster."),
        ]
    )
    script.researchers.add(
        RESEARCH,
        Reply(calls=(Call("append_scratchpad", {"kind": "note", "content": "step sizes up to 1/L converge"}, "n"),)),
        Reply(content=RESEARCH_SUMMARY, input_tokens=1000, output_tokens=500),
    )
    script.engineer.extend(
        [
            Reply(calls=(Call("write_file", {"path": "config.json", "content": BETTER_CONFIG}, "w"),)),
            Reply(content="config.json now says lr 0.1"),
        ]
    )
    message = spec(lab.project, cycles=3)
    message.signals.CopyFrom(campaign_pb2.CampaignSignalRules(baseline_runs=2))
    campaign = await lab.campaigns.start_campaign(message, request_id="lab-research")
    stream = [event async for event in lab.campaigns.stream_campaign(campaign.campaign_id)]

    assert stream[-1].ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED, stream[-1].ended.reason
    # The research worker was given the leader's objective and criteria.
    (asked, *_) = script.researchers.requests[RESEARCH]
    task = next(m["content"] for m in asked["messages"] if m["role"] == "user")
    assert task.startswith(f"Task: {RESEARCH}") and "- cite a step size" in task
    # The leader saw its summary and the findings it promoted before it delegated the change.
    seen = [m.get("content") or "" for m in script.leader_requests[1]["messages"] if m["role"] == "tool"]
    assert len(seen) == 1 and RESEARCH_SUMMARY in seen[0] and "findings promoted: 1" in seen[0]
    # Then the cycle went on as usual: the engineer's change committed, run and kept.
    rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
    assert [row.verdict for row in rows] == [BASELINE, BASELINE, KEEP]
    assert git(lab.project, "show", f"{rows[2].commit}:config.json") + "\n" == BETTER_CONFIG
    # The research's usage counts in the cycle's tokens; its note is on the campaign's thread.
    assert rows[2].tokens_used >= 1500
    entries = await lab.scratchpad.read_all(campaign.campaign_id)
    notes = [e.content for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_NOTE]
    assert notes == ["step sizes up to 1/L converge"]
    # Both delegations went through the run's delegation desk: each assigned, routed and its usage recorded.
    assigned = [json.loads(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_ASSIGNMENT]
    assert [(a["role"], a["objective"]) for a in assigned] == [
        ("researcher", RESEARCH),
        ("engineer", "Set lr to 0.1 in config.json."),
    ]
    delegations = {a["delegation_id"] for a in assigned}
    for kind in (scratchpad_pb2.ENTRY_KIND_ROUTE, scratchpad_pb2.ENTRY_KIND_USAGE):
        assert {json.loads(e.content)["delegation_id"] for e in entries if e.kind == kind} == delegations, kind


async def test_stagnation_is_signalled_and_the_phase_gate_completes_the_campaign(lab: Lab) -> None:
    lab.script.cycle("Set lr to 0.001 in config.json.", WORSE_CONFIG, "A smaller learning rate is more stable.")
    lab.script.cycle("Set lr to 0.1 in config.json.", BETTER_CONFIG, "A larger learning rate converges faster.")
    message = spec(lab.project, cycles=10)
    message.signals.CopyFrom(
        campaign_pb2.CampaignSignalRules(baseline_runs=2, stagnation_window=1, phase_gate=0.01, stop_at_phase_gate=True)
    )
    campaign = await lab.campaigns.start_campaign(message, request_id="lab-gate")
    stream = [event async for event in lab.campaigns.stream_campaign(campaign.campaign_id)]

    rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
    assert [row.verdict for row in rows] == [BASELINE, BASELINE, DISCARD, KEEP]
    kinds = [event.signal.kind for event in stream if event.HasField("signal")]
    assert kinds == [
        campaign_pb2.CAMPAIGN_SIGNAL_KIND_NOISE_FLOOR,
        campaign_pb2.CAMPAIGN_SIGNAL_KIND_STAGNATION,
        campaign_pb2.CAMPAIGN_SIGNAL_KIND_PHASE_GATE,
    ]
    ended = stream[-1].ended
    assert ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED and "phase gate" in ended.reason


async def test_the_limiter_makes_the_campaign_sleep_and_say_why(lab: Lab) -> None:
    message = spec(lab.project, cycles=10)
    message.budgets.max_cycles_per_hour = 2
    message.signals.CopyFrom(campaign_pb2.CampaignSignalRules(baseline_runs=2))
    campaign = await lab.campaigns.start_campaign(message, request_id="lab-limit")
    async for event in lab.campaigns.stream_campaign(campaign.campaign_id):
        if event.HasField("sleeping"):
            sleeping = event.sleeping
            break
    asleep = await lab.campaigns.get_campaign(campaign.campaign_id)
    assert asleep.state == campaign_pb2.CAMPAIGN_STATE_SLEEPING
    assert "cycles" in sleeping.reason
    assert sleeping.until.ToDatetime(tzinfo=UTC) > datetime.now(UTC)
    assert lab.script.times == []  # two baseline runs, then the wait: no model call
    stopped = await lab.campaigns.stop_campaign(campaign.campaign_id)
    assert stopped.state == campaign_pb2.CAMPAIGN_STATE_STOPPED


async def test_a_job_stopped_at_its_time_limit_is_a_failed_cycle_and_a_recorded_violation(lab: Lab) -> None:
    endless = '{"lr": 0.1, "steps": 20, "sleep": 60}\n'
    lab.script.cycle("Let the training sleep a minute.", endless, "Sleeping helps.")
    message = spec(lab.project, cycles=3)
    message.experiment.wall_clock_limit.FromSeconds(3)
    message.signals.CopyFrom(campaign_pb2.CampaignSignalRules(baseline_runs=2))
    campaign = await lab.campaigns.start_campaign(message, request_id="lab-budget")
    stream = [event async for event in lab.campaigns.stream_campaign(campaign.campaign_id)]

    rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
    assert [row.verdict for row in rows] == [BASELINE, BASELINE, FAILED]
    assert rows[2].job_state == monitor_pb2.JOB_STATE_TIMED_OUT
    found = [event.violation for event in stream if event.HasField("violation")]
    assert [(v.cycle, v.rule, v.subject) for v in found] == [
        (3, campaign_pb2.VIOLATION_RULE_JOB_OVER_BUDGET, rows[2].job_id)
    ]
    entries = await lab.scratchpad.read_all(campaign.campaign_id)
    decisions = [json.loads(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_CAMPAIGN_DECISION]
    assert [d["rule"] for d in decisions if d["kind"] == "violation"] == ["job_over_budget"]


async def test_a_workspace_the_monitor_refuses_pauses_the_campaign_with_the_reason(lab: Lab, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    campaign = await lab.campaigns.start_campaign(spec(elsewhere, cycles=3), request_id="lab-refused")
    reason = ""
    async for event in lab.campaigns.stream_campaign(campaign.campaign_id):  # a paused campaign's stream goes on
        if event.HasField("paused"):
            reason = event.paused.reason
            break
    assert "FAILED_PRECONDITION" in reason and "root" in reason, reason
    paused = await lab.campaigns.get_campaign(campaign.campaign_id)
    assert paused.state == campaign_pb2.CAMPAIGN_STATE_PAUSED
    assert lab.script.times == []


# -- the happy path on an SSH host, and through Slurm --------------------------------------------------


@contextlib.asynccontextmanager
async def remote_lab(tmp_path: Path, model: ScriptedModel) -> AsyncIterator[tuple[Lab, FakeHost]]:
    """The lab with its workspace on the SSH host gpu1 (tests/monitor_svc/fake_ssh.py, on loopback): the monitor
    opens and edits it over SSH and runs its jobs there, their logs under the host's log root."""
    project = make_project(tmp_path / "roots")
    (tmp_path / "logs").mkdir()  # the host's log root
    async with fake_ssh_host(tmp_path) as host:
        settings = host.settings(workspace_roots=[str(project.parent)], job_poll_seconds=0.2)
        async with open_lab(tmp_path, model, project, settings) as opened:
            yield opened, host


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


async def test_the_happy_path_with_the_workspace_on_an_ssh_host(tmp_path: Path, model: ScriptedModel) -> None:
    async with remote_lab(tmp_path, model) as (lab, host):
        script_keep_then_discard(lab.script)
        initial = git(lab.project, "rev-parse", "HEAD")
        ran = await run_campaign(lab, on_the_host(lab.project), "lab-ssh")

    assert_measured_kept_and_discarded(lab.project, ran, initial)
    jobs = jobs_by_cycle(ran)
    assert sorted(jobs) == [1, 2, 3, 4, 5]
    assert all(job.WhichOneof("target") == "remote" and job.remote.host == "gpu1" for job in jobs.values()), jobs
    launches = [command for command in host.commands if sys.executable in command and "train.py" in command]
    assert len(launches) == 5, "each experiment started over SSH, once"
    assert_each_metric_is_the_monitors_reading_of_the_jobs_log(ran, tmp_path / "logs")


async def test_the_happy_path_through_slurm(tmp_path: Path, model: ScriptedModel) -> None:
    async with remote_lab(tmp_path, model) as (lab, host):
        host.run_batch_jobs()
        script_keep_then_discard(lab.script)
        initial = git(lab.project, "rev-parse", "HEAD")
        message = on_the_host(lab.project)
        message.experiment.ClearField("argv")
        message.experiment.slurm.script_path = "train.sh"
        message.experiment.slurm.sbatch_args.append("--partition=cpu")
        ran = await run_campaign(lab, message, "lab-slurm")

    assert_measured_kept_and_discarded(lab.project, ran, initial)
    jobs = jobs_by_cycle(ran)
    assert [(job.slurm.host, job.slurm.job_id) for _, job in sorted(jobs.items())] == [
        ("gpu1", str(job_id)) for job_id in range(101, 106)
    ]
    submissions = host.batch_submissions()
    assert len(submissions) == 5, "each experiment submitted once"
    for arguments in submissions:
        assert arguments[:2] == ["--parsable", "--partition=cpu"] and arguments[-1] == f"{lab.project}/train.sh"
        assert f"--chdir={lab.project}" in arguments and "--time=0-00:01:00" in arguments
    assert_each_metric_is_the_monitors_reading_of_the_jobs_log(ran, tmp_path / "logs")
