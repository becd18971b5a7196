"""Campaign benchmark: what the loop costs around its jobs, and that no model is called while a job runs.

    python3 bench/campaign.py [--job-seconds 5] [--cycles 4] [--latency 0.0] [--rounds 5]

Starts the scratchpad, the monitor (job submission on, the workspace's root allowed), an engineer worker and the
supervisor as `quarry serve` processes with mesh tokens; the scripted OpenAI-compatible model runs in this process
and reports tokens as the characters it is sent and sends / 4. The workspace is a temporary git repository with a
tiny CPU "training" script that sleeps `job_seconds` and prints its validation loss. Each of `rounds` rounds
(bench/rounds.py) runs one campaign of `cycles` cycles on a fresh copy of the workspace, the services staying up:
two baseline runs, then experiments whose THINK is two leader turns (delegate, hypothesis) and whose engineer
writes config.json in two turns; each model turn waits `latency` seconds.

Per cycle, from the campaign's events and the scripted server's request log (the table, each round):
  - wall time: the ledger row's start to end;
  - model time: the spans of the model requests inside the cycle (arrival to the reply's last byte);
  - job time: the cycle's WAITING phase to its REFLECT phase (launch seen to the job's end seen by the monitor);
  - overhead: wall time minus model time and job time;
  - model calls and tokens, and model calls during the job (between WAITING and REFLECT; must be 0).
Per round: the cycles' overhead p50 and p99 and its median share of a cycle's wall time, the median wall and
job time of a cycle, the model time, model calls and tokens of an experiment cycle (mean), and the model calls
during jobs (sum); each as the median (range) over rounds, with the load average of each round.
Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from harness import arguments, mesh_environment, percentile, running_service
from rounds import MIN_ROUNDS, Rounds

from quarry.clients.campaigns import CampaignsClient
from quarry.identity import MeshRole
from quarry.v1 import campaign_pb2, monitor_pb2
from supervisor_svc.campaigns.think import INSTRUCTIONS
from tests.fakes.openai_server import Call, HttpError, Reply, ScriptedModel, Step

TRAIN = """\
import json, random, time

config = json.load(open("config.json"))
x = 0.0
for step in range(config["steps"]):
    x -= config["lr"] * 2 * (x - 3.0)  # gradient descent on (x - 3)^2
time.sleep(config["sleep"])
print(f"val_loss={(x - 3.0) ** 2 + random.uniform(0, 0.002):.6f}", flush=True)
"""
LEADER = INSTRUCTIONS.split("\n", 1)[0]
BASELINE_RUNS = 2
LEARNING_RATES = (0.1, 0.001, 0.2, 0.05, 0.3, 0.02)


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def make_project(project: Path, job_seconds: int) -> Path:
    project.mkdir(parents=True)
    (project / "train.py").write_text(TRAIN)
    (project / "config.json").write_text(json.dumps({"lr": 0.01, "steps": 20, "sleep": job_seconds}) + "\n")
    git(project, "init", "-q", "-b", "main")
    git(project, "-c", "user.name=B", "-c", "user.email=b@example.com", "add", "-A")
    git(project, "-c", "user.name=B", "-c", "user.email=b@example.com", "commit", "-q", "-m", "initial")
    return project.resolve()


@dataclasses.dataclass
class Script:
    """The leader's and the engineer's turns, told apart by the leader's instructions, with usage by size."""

    leader: list[Step] = dataclasses.field(default_factory=list)
    engineer: list[Step] = dataclasses.field(default_factory=list)
    tokens: list[tuple[float, int]] = dataclasses.field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> Step:
        queue = self.leader if LEADER in (body["messages"][0].get("content") or "") else self.engineer
        if not queue:
            return HttpError(400, message="no script left")
        step = queue.pop(0)
        if isinstance(step, Reply):
            sent = len(json.dumps(body["messages"])) // 4
            produced = (len(step.content) + sum(len(json.dumps(call.arguments)) for call in step.calls)) // 4
            step = dataclasses.replace(step, input_tokens=sent, output_tokens=max(produced, 1))
            self.tokens.append((time.time(), step.input_tokens + step.output_tokens))
        return step

    def experiment(self, n: int, job_seconds: int, latency: float) -> None:
        lr = LEARNING_RATES[n % len(LEARNING_RATES)]
        config = json.dumps({"lr": lr, "steps": 20, "sleep": job_seconds}) + "\n"
        self.leader += [
            Reply(calls=(Call("delegate_engineer", {"change": f"Set lr to {lr}."}, f"e-{n}"),), delay=latency),
            Reply(content=f"A learning rate of {lr} converges better.", delay=latency),
        ]
        self.engineer += [
            Reply(calls=(Call("write_file", {"path": "config.json", "content": config}, f"w-{n}"),), delay=latency),
            Reply(content=f"config.json now says lr {lr}.", delay=latency),
        ]


def spec(project: Path, cycles: int, job_seconds: int) -> campaign_pb2.CampaignSpec:
    message = campaign_pb2.CampaignSpec(
        title="bench",
        brief=campaign_pb2.CampaignBrief(goal="Lower the validation loss.", protected_paths=["train.py"]),
        workspace=campaign_pb2.CampaignWorkspace(root=str(project)),
        metric=monitor_pb2.MetricSpec(
            name="val_loss", direction=monitor_pb2.METRIC_DIRECTION_MINIMIZE, log_regex=r"val_loss=([0-9.]+)"
        ),
        experiment=campaign_pb2.CampaignExperiment(argv=[sys.executable, "train.py"]),
        budgets=campaign_pb2.CampaignBudgets(max_cycles=cycles),
        signals=campaign_pb2.CampaignSignalRules(baseline_runs=BASELINE_RUNS),
    )
    message.experiment.wall_clock_limit.FromSeconds(job_seconds + 60)
    return message


def seconds(event: campaign_pb2.CampaignEvent) -> float:
    return event.create_time.seconds + event.create_time.nanos / 1e9


def phase_times(events: list[campaign_pb2.CampaignEvent], phase: int) -> dict[int, float]:
    return {
        e.phase_changed.cycle: seconds(e)
        for e in events
        if e.HasField("phase_changed") and e.phase_changed.phase == phase
    }


@contextmanager
def services(
    workdir: Path, roots: Path, model: ScriptedModel, monitor_extra: dict[str, str] | None = None
) -> Iterator[str]:
    """The scratchpad, the monitor (with `monitor_extra` in its environment), an engineer worker and the supervisor
    as processes: the supervisor's address."""
    common = {"QUARRY_DATA_DIR": str(workdir / "data"), "QUARRY_LOG_LEVEL": "WARNING"}
    model_env = {"QUARRY_MODEL_BASE_URL": model.base_url, "QUARRY_MODEL_NAME": "scripted"}
    with ExitStack() as stack:
        _, scratchpad = stack.enter_context(
            running_service("scratchpad", {**common, **mesh_environment(None)}, workdir)
        )
        monitor_env = {
            **common,
            **mesh_environment(None),
            "QUARRY_MONITOR_ALLOW_JOB_SUBMISSION": "true",
            "QUARRY_MONITOR_WORKSPACE_ROOTS": json.dumps([str(roots)]),
            **(monitor_extra or {}),
        }
        _, monitor = stack.enter_context(running_service("monitor", monitor_env, workdir))
        worker_env = {
            **common,
            **model_env,
            **mesh_environment(MeshRole.WORKER),
            "QUARRY_WORKER_DATABASE_URL": f"sqlite:///{workdir / 'worker.db'}",
            "QUARRY_WORKER_SCRATCHPAD_ADDRESS": scratchpad,
            "QUARRY_WORKER_MONITOR_ADDRESS": monitor,
        }
        _, worker = stack.enter_context(running_service("worker", worker_env, workdir))
        supervisor_env = {
            **common,
            **model_env,
            **mesh_environment(MeshRole.SUPERVISOR),
            "QUARRY_SUPERVISOR_DATABASE_URL": f"sqlite:///{workdir / 'supervisor.db'}",
            "QUARRY_SUPERVISOR_SCRATCHPAD_ADDRESS": scratchpad,
            "QUARRY_SUPERVISOR_WORKER_ADDRESSES": worker,
            "QUARRY_SUPERVISOR_MONITOR_ADDRESS": monitor,
        }
        _, supervisor = stack.enter_context(running_service("supervisor", supervisor_env, workdir))
        yield supervisor


async def main_async(args: argparse.Namespace) -> None:
    if args.cycles <= BASELINE_RUNS:
        raise SystemExit(f"--cycles must be more than the {BASELINE_RUNS} baseline runs")
    rounds = Rounds("campaign", args.rounds)
    async with ScriptedModel() as model:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            roots = (workdir / "roots").resolve()
            roots.mkdir()
            with services(workdir, roots, model) as supervisor:
                async with CampaignsClient.connect(supervisor) as campaigns:
                    for index in rounds:
                        script = Script()
                        for n in range(args.cycles - BASELINE_RUNS):
                            script.experiment(n, args.job_seconds, args.latency)
                        model.default = script
                        model.exchanges.clear()
                        project = make_project(roots / f"project-{index}", args.job_seconds)
                        started = await campaigns.start_campaign(
                            spec(project, args.cycles, args.job_seconds), request_id=f"bench-{index}"
                        )
                        events = [e async for e in campaigns.stream_campaign(started.campaign_id)]
                        # The server stamps its exchanges on the monotonic clock; the events carry wall-clock times.
                        offset = time.time() - time.monotonic()
                        spans = [(arrival + offset, end + offset) for arrival, end, _ in model.exchanges]
                        measure(rounds, events, spans, script.tokens)
    print(f"{args.cycles} cycles a campaign ({BASELINE_RUNS} baseline runs), {args.job_seconds} s jobs")
    rounds.report()


def measure(
    rounds: Rounds,
    events: list[campaign_pb2.CampaignEvent],
    spans: list[tuple[float, float]],
    usage: list[tuple[float, int]],
) -> None:
    """Prints the campaign's cycles and records this round's figures."""
    ended = events[-1].ended
    if ended.state != campaign_pb2.CAMPAIGN_STATE_COMPLETED:
        raise SystemExit(f"campaign ended {campaign_pb2.CampaignState.Name(ended.state)}: {ended.reason}")
    rows = [e.ledger_recorded for e in events if e.HasField("ledger_recorded")]
    waiting = phase_times(events, campaign_pb2.CAMPAIGN_PHASE_WAITING)
    reflecting = phase_times(events, campaign_pb2.CAMPAIGN_PHASE_REFLECT)
    print(
        f"{'cycle':>5} {'verdict':>8} {'wall s':>8} {'model s':>8} {'job s':>8} {'overhead ms':>12} "
        f"{'calls':>6} {'tokens':>7} {'in job':>7}"
    )
    overheads, shares, walls, jobs, during = [], [], [], [], 0
    models, calls, tokens = [], [], []  # experiment cycles only: a baseline cycle calls no model
    for row in rows:
        start = row.start_time.seconds + row.start_time.nanos / 1e9
        end = row.end_time.seconds + row.end_time.nanos / 1e9
        inside = [(a, b) for a, b in spans if start <= a <= end]
        model_s = sum(b - a for a, b in inside)
        job_s = reflecting[row.cycle] - waiting[row.cycle]
        overhead = end - start - model_s - job_s
        in_job = sum(1 for a, _ in spans if waiting[row.cycle] <= a <= reflecting[row.cycle])
        used = sum(n for moment, n in usage if start <= moment <= end)
        verdict = campaign_pb2.LedgerVerdict.Name(row.verdict).removeprefix("LEDGER_VERDICT_").lower()
        print(
            f"{row.cycle:>5} {verdict:>8} {end - start:>8.2f} {model_s:>8.3f} {job_s:>8.2f} "
            f"{overhead * 1000:>12.1f} {len(inside):>6} {used:>7} {in_job:>7}"
        )
        overheads.append(overhead * 1000)
        shares.append(100 * overhead / (end - start))
        walls.append(end - start)
        jobs.append(job_s)
        during += in_job
        if row.verdict != campaign_pb2.LEDGER_VERDICT_BASELINE:
            models.append(model_s * 1000)
            calls.append(len(inside))
            tokens.append(used)
    rounds.record("overhead per cycle p50", percentile(overheads, 0.5), "ms")
    rounds.record("overhead per cycle p99", percentile(overheads, 0.99), "ms")
    rounds.record("overhead share of a cycle", statistics.median(shares), "%")
    rounds.record("wall time per cycle", statistics.median(walls), "s")
    rounds.record("job time per cycle", statistics.median(jobs), "s")
    rounds.record("model time per experiment cycle", statistics.mean(models), "ms")
    rounds.record("model calls per experiment cycle", statistics.mean(calls))
    rounds.record("tokens per experiment cycle", statistics.mean(tokens), "tokens")
    rounds.record("model calls during jobs (must be 0)", during)
    rounds.record("model calls in all", len(spans))


def main() -> None:
    asyncio.run(main_async(arguments(__doc__, job_seconds=5, cycles=4, latency=0.0, rounds=MIN_ROUNDS)))


if __name__ == "__main__":
    main()
