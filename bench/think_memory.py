"""THINK's memory benchmark: what one leader turn is sent, as the campaign's history grows.

    python3 bench/think_memory.py [--cycles 10,50,200]

A synthetic ledger of each length, with text as long as a real campaign's (hypotheses of about 140 characters,
conclusions of about 110, a dead end every fourth failed or discarded cycle, an insight every tenth cycle with
its source, three baseline runs then every twentieth cycle a rebaseline, a keep every seventh). For each, the
THINK opening the supervisor sends on every leader turn: the instructions, the briefing (supervisor_svc.campaigns
.memory), and the tool schemas. Prints characters and tokens (estimated as characters / 4, as the scripted model
counts) per part. The figures are deterministic: no rounds.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta

from quarry.records.campaign import CampaignRecord, DeadEnd, Decision, Insight, InsightSource, TrialRecord, Verdict
from quarry.records.signals import read_signals
from quarry.vocabulary import JobState, MetricDirection
from supervisor_svc.campaigns.memory import think_briefing
from supervisor_svc.campaigns.spec import Brief, CampaignSpec, Experiment, Metric, Rules, Workspace
from supervisor_svc.campaigns.think import INSTRUCTIONS, THINK_TOOLS

GOAL = (
    "Lower the validation loss of the small transformer on the bundled text corpus within 5 minutes of "
    "training on one GPU, without changing the evaluation script or the data split."
)
START = datetime(2026, 12, 1, tzinfo=UTC)


def ledger(cycles: int) -> list[CampaignRecord]:
    records: list[CampaignRecord] = []
    best = 4.0
    for cycle in range(1, cycles + 1):
        baseline = cycle <= 3 or cycle % 20 == 0
        hypothesis = (
            "baseline"
            if baseline
            else f"Raise the learning rate warmup to {cycle * 10} steps and lower weight decay to 0.0{cycle % 9}, "
            "which should stabilise the first epoch without slowing convergence."
        )
        if baseline:
            verdict, value = Verdict.BASELINE, best + 0.001 * (cycle % 3)
        elif cycle % 7 == 0:
            best -= 0.05
            verdict, value = Verdict.KEEP, best
        elif cycle % 5 == 0:
            verdict, value = Verdict.FAILED, None
        else:
            verdict, value = Verdict.DISCARD, best + 0.02
        started = START + timedelta(minutes=10 * cycle)
        if not baseline:
            records.append(Decision(cycle=cycle, text=hypothesis, commit=f"{cycle:040x}", action="edit config.toml"))
        records.append(
            TrialRecord(
                cycle=cycle,
                hypothesis=hypothesis,
                action="edit config.toml and run train.py",
                commit=f"{cycle:040x}",
                job_id=f"job-{cycle:016x}",
                job_state=JobState.FAILED if value is None else JobState.COMPLETED,
                exit_code=1 if value is None else 0,
                metrics={"val_loss": value},
                verdict=verdict,
                conclusion=f"{verdict.value}: val_loss moved against a best of {best:.4f} and a noise floor of 0.004",
                tokens_used=0 if baseline else 5000,
                started_at=started,
                ended_at=started + timedelta(minutes=5),
            )
        )
        if verdict in (Verdict.FAILED, Verdict.DISCARD) and cycle % 4 == 0:
            records.append(DeadEnd(cycle=cycle, approach=hypothesis[:120], reason="worse than the kept state"))
        if cycle % 10 == 0:
            source = InsightSource(finding_ref=cycle, url="https://arxiv.org/abs/1706.03762", excerpt="warmup helps")
            records.append(
                Insight(
                    cycle=cycle, text="Warmup beyond 2% of the steps stops helping at this scale.", sources=(source,)
                )
            )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", default="10,50,200")
    args = parser.parse_args()
    spec = CampaignSpec(
        brief=Brief(goal=GOAL, protected_paths=("eval.py", "data/")),
        workspace=Workspace(root="/srv/project"),
        metric=Metric("val_loss", MetricDirection.MINIMIZE, log_regex=r"val_loss=([0-9.]+)"),
        experiment=Experiment(argv=("python3", "train.py"), wall_clock_seconds=300.0),
        rules=Rules(baseline_runs=3, rebaseline_every=20),
    )
    tools = len(json.dumps(THINK_TOOLS.schemas()))
    print(f"{'cycles':>6} {'instructions':>12} {'briefing':>9} {'tools':>6} {'opening':>8} {'tokens':>7}")
    for cycles in (int(text) for text in args.cycles.split(",")):
        records = ledger(cycles)
        trials = [record for record in records if isinstance(record, TrialRecord)]
        signals = read_signals(trials, spec.metric.goal, spec.signal_rules())
        briefing = len(think_briefing(spec.brief.goal, records, signals).render())
        opening = len(INSTRUCTIONS) + briefing + tools
        print(f"{cycles:>6} {len(INSTRUCTIONS):>12} {briefing:>9} {tools:>6} {opening:>8} {opening // 4:>7}")


if __name__ == "__main__":
    main()
