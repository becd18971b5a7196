"""`quarry lab` as a user runs it: real processes against a supervisor whose campaigns are driven by a stand-in
loop (tests/supervisor_svc/campaign_loops.py), and the campaign file's parsing on its own."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console

from quarry.cli.arguments import build_parser
from quarry.cli.lab.spec import SpecError, load_settings, settings_from_flags, spec_from_settings
from quarry.cli.lab.view import CampaignView
from quarry.records.campaign import TrialRecord, Verdict
from quarry.v1 import campaign_pb2, monitor_pb2
from quarry.vocabulary import JobRef, JobState, MetricPoint
from supervisor_svc.campaigns import events
from supervisor_svc.campaigns.state import CampaignState, JobProgress, Phase, Progress
from tests.fakes.openai_server import ScriptedModel
from tests.supervisor_svc.campaign_loops import ServedCampaigns, campaign_spec, serve_campaigns

CAMPAIGN_FILE = """
title = "tiny regression"
[brief]
goal = "Lower the validation loss."
constraints = ["Keep it under a minute."]
protected_paths = ["eval.py"]
[workspace]
root = "/srv/tiny"
[metric]
name = "val_loss"
direction = "minimize"
log_regex = 'val_loss=(\\S+)'
[experiment]
command = "python3 train.py --steps 100"
wall_clock_seconds = 120
[budgets]
max_cycles = 40
stop_time = 2099-01-01T00:00:00Z
[signals]
baseline_runs = 3
phase_gate = 0.1
"""


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """The command line is what is tested here; the store runs on both databases elsewhere."""
    return f"sqlite:///{tmp_path / 'supervisor.db'}"


@pytest.fixture
async def served(tmp_path: Path, database_url: str, model: ScriptedModel) -> AsyncIterator[ServedCampaigns]:
    async with serve_campaigns(tmp_path, database_url, model) as served:
        yield served


async def lab(served: ServedCampaigns, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quarry",
        "lab",
        *args,
        "--address",
        served.host.address,
        env={**os.environ, "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_start_from_a_file_with_a_flag_over_it_then_list_show_and_direct(
    served: ServedCampaigns, tmp_path: Path
) -> None:
    code, empty = await lab(served, "list")
    assert code == 0 and "no campaigns yet; start one with `quarry lab start campaign.toml`" in empty, empty
    path = tmp_path / "campaign.toml"
    path.write_text(CAMPAIGN_FILE)
    code, output = await lab(served, "start", str(path), "--max-cycles", "7", "--json")
    assert code == 0, output
    started = json.loads(output)
    campaign_id = started["campaignId"]
    campaign = await served.client.get_campaign(campaign_id)
    assert campaign.spec.title == "tiny regression" and list(campaign.spec.brief.protected_paths) == ["eval.py"]
    assert list(campaign.spec.experiment.argv) == ["python3", "train.py", "--steps", "100"]
    assert campaign.spec.budgets.max_cycles == 7, "the flag wins over the file"
    assert campaign.spec.signals.phase_gate == 0.1
    await served.loops.next_started()

    code, listed = await lab(served, "list")
    assert code == 0 and campaign_id in listed and "running" in listed and "tiny regression" in listed
    code, directed = await lab(served, "direct", campaign_id, "Try a cosine schedule.")
    assert code == 0 and "pending" in directed, directed
    code, shown = await lab(served, "show", campaign_id)
    assert code == 0, shown
    assert "Lower the validation loss." in shown and "think of cycle 1" in shown
    assert "directives waiting for the next THINK: 1" in shown and "cycles: 0 of 7" in shown
    code, stopped = await lab(served, "stop", campaign_id, "--reason", "enough for today")
    assert code == 0 and f"{campaign_id}: stopped" in stopped
    code, refused = await lab(served, "pause", campaign_id)
    assert code == 1 and "FAILED_PRECONDITION" in refused and "Traceback" not in refused


def _record(cycle: int, verdict: Verdict, value: float | None, commit: str = "") -> TrialRecord:
    start = datetime(2026, 12, 1, tzinfo=UTC) + timedelta(minutes=10 * cycle)
    return TrialRecord(
        cycle=cycle,
        hypothesis=f"hypothesis {cycle}",
        action="edit train.py" if verdict is not Verdict.BASELINE else "baseline",
        commit=commit or f"{cycle:040x}",
        metrics={"val_loss": value},
        verdict=verdict,
        conclusion=f"conclusion {cycle}",
        tokens_used=100 * cycle,
        started_at=start,
        ended_at=start + timedelta(minutes=5),
    )


LEDGER = [
    _record(1, Verdict.BASELINE, 0.50, "a" * 40),
    _record(2, Verdict.BASELINE, 0.52, "a" * 40),
    _record(3, Verdict.BASELINE, 0.51, "a" * 40),
    _record(4, Verdict.KEEP, 0.40),
    _record(5, Verdict.DISCARD, 0.45),
    _record(6, Verdict.FAILED, None),
    _record(7, Verdict.RETEST, 0.385, "b" * 40),
    _record(8, Verdict.DISCARD, 0.39, "b" * 40),
]


async def test_a_refused_campaign_is_said_in_the_flags_and_file_keys_it_was_given_in(
    served: ServedCampaigns, tmp_path: Path
) -> None:
    path = tmp_path / "campaign.toml"
    path.write_text(CAMPAIGN_FILE.replace("wall_clock_seconds = 120", "wall_clock_seconds = 0"))
    code, output = await lab(served, "start", str(path), "--baseline-runs", "1", "--gpus", "-1")
    assert code == 2, output
    lines = output.strip().splitlines()
    assert "quarry lab start: --baseline-runs (signals.baseline_runs in the campaign file): between 2 and 100" in lines
    assert any(
        line.startswith("quarry lab start: --experiment-seconds (experiment.wall_clock_seconds in the campaign file): ")
        for line in lines
    ), output
    assert any(line.startswith("quarry lab start: --gpus (experiment.gpus in the campaign file): ") for line in lines)
    assert "spec." not in output and "Traceback" not in output
    assert (await served.client.list_campaigns()).campaigns == [], "nothing was started"


async def test_ledger_and_plot_read_the_ledger_recorded_events(served: ServedCampaigns, tmp_path: Path) -> None:
    started = await served.client.start_campaign(campaign_spec())
    handle = await served.loops.next_started()
    for record in LEDGER:
        assert await handle.record_trial(record, Progress(best_value=0.4))
    await handle.finish(CampaignState.COMPLETED, "the cycle budget is spent")

    code, table = await lab(served, "ledger", started.campaign_id)
    assert code == 0, table
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in table.splitlines() if "│" in line]
    assert [row[:3] for row in cells] == [
        ["1", "baseline", "0.5"],
        ["2", "baseline", "0.52"],
        ["3", "baseline", "0.51"],
        ["4", "keep", "0.4"],
        ["5", "discard", "0.45"],
        ["6", "failed", "-"],
        ["7", "retest", "0.385"],
        ["8", "discard", "0.39"],
    ]
    code, lines = await lab(served, "ledger", started.campaign_id, "--jsonl")
    assert code == 0, lines
    rows = [json.loads(line) for line in lines.splitlines()]
    assert [row["cycle"] for row in rows] == list(range(1, 9))
    assert rows[5]["verdict"] == "LEDGER_VERDICT_FAILED" and "value" not in rows[5]["metrics"][0]

    output = tmp_path / "plot.png"
    code, said = await lab(served, "plot", started.campaign_id, "-o", str(output))
    assert code == 0 and f"wrote {output}" in said, said
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(output) as image:
        assert image.size == (1200, 660)


def _flags(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["lab", "start", *argv])


def test_a_campaign_file_with_an_unknown_setting_or_a_wrong_type_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"brief\.goals: not a setting of \[brief\]"):
        spec_from_settings({"brief": {"goals": "x"}})
    with pytest.raises(SpecError, match=r"experiment\.wall_clock_seconds: must be a number"):
        spec_from_settings({"experiment": {"wall_clock_seconds": "300"}})
    with pytest.raises(SpecError, match=r"budgets\.stop_time: needs a time zone"):
        spec_from_settings({"budgets": {"stop_time": datetime(2099, 1, 1)}})
    with pytest.raises(SpecError, match=r"metric\.direction: minimize or maximize"):
        spec_from_settings({"metric": {"direction": "down"}})
    path = tmp_path / "broken.toml"
    path.write_text("[brief\n")
    with pytest.raises(SpecError, match=r"broken\.toml"):
        load_settings(path, {})


def test_flags_alone_make_a_spec_and_lay_over_a_file_section_by_section(tmp_path: Path) -> None:
    args = _flags(
        "--goal", "Raise accuracy.", "--root", "/srv/w", "--metric", "acc", "--direction", "maximize",
        "--jsonl-path", "metrics.jsonl", "--jsonl-key", "acc", "--command", "./run.sh", "--experiment-seconds", "90",
        "--protected", "eval.py", "--protected", "data/", "--stop-time", "2099-01-01T00:00:00+01:00", "--stop-at-gate",
        "--phase-gate", "0.9", "--report-at-end",
    )  # fmt: skip
    spec = spec_from_settings(load_settings(None, settings_from_flags(args)))
    assert spec.brief.goal == "Raise accuracy." and list(spec.brief.protected_paths) == ["eval.py", "data/"]
    assert spec.metric.direction == monitor_pb2.METRIC_DIRECTION_MAXIMIZE
    assert (spec.metric.jsonl_file.path, spec.metric.jsonl_file.key) == ("metrics.jsonl", "acc")
    assert spec.experiment.command_line == "./run.sh" and spec.experiment.wall_clock_limit.seconds == 90
    assert spec.budgets.stop_time.ToDatetime(tzinfo=UTC) == datetime(2098, 12, 31, 23, tzinfo=UTC)
    assert spec.signals.stop_at_phase_gate and spec.signals.phase_gate == 0.9
    assert spec.write_report_at_end
    assert spec_from_settings({"write_report_at_end": True}).write_report_at_end
    path = tmp_path / "campaign.toml"
    path.write_text(CAMPAIGN_FILE)
    merged = spec_from_settings(load_settings(path, settings_from_flags(_flags("--goal", "Other goal."))))
    assert merged.brief.goal == "Other goal." and list(merged.brief.constraints) == ["Keep it under a minute."]


def test_a_campaign_file_or_a_flag_runs_the_experiment_as_a_slurm_batch_script() -> None:
    data = {"workspace": {"host": "gpu1"}, "experiment": {"slurm_script": "train.sh", "sbatch_args": ["-p", "gpu"]}}
    spec = spec_from_settings(data)
    assert spec.experiment.slurm == campaign_pb2.CampaignSlurm(script_path="train.sh", sbatch_args=["-p", "gpu"])
    assert not spec.experiment.argv and not spec.experiment.command_line
    flagged = spec_from_settings(load_settings(None, settings_from_flags(_flags("--slurm-script", "run.sh"))))
    assert flagged.experiment.slurm.script_path == "run.sh"
    assert not spec_from_settings({"experiment": {"command": "./run.sh"}}).experiment.HasField("slurm")


def test_the_live_view_shows_the_cycle_the_running_job_its_log_the_best_and_the_last_rows() -> None:
    campaign = campaign_pb2.Campaign(campaign_id="campaign-" + "1" * 32, spec=campaign_spec())
    campaign.spec.signals.CopyFrom(campaign_pb2.CampaignSignalRules(baseline_runs=3, max_retests=2))
    view = CampaignView(campaign)
    stored = [events.ledger_recorded(record) for record in LEDGER[:4]]
    stored.append(events.phase_changed(Phase.WAITING, 5, "waiting for the experiment"))
    progress = JobProgress(
        cycle=5,
        job=JobRef("local", pid=4242, monitor_job_id="job-7"),
        state=JobState.RUNNING,
        gpu_indices=(0, 1),
        log_tail=("step 10 loss 0.9", "step 20 val_loss=0.47"),
        metric_points=(MetricPoint("val_loss", 0.47, 2),),
    )
    stored.append(events.job_progress(progress))
    for sequence_no, event in enumerate(stored, start=1):
        view.apply(
            campaign_pb2.CampaignEvent.FromString(event.stored(campaign.campaign_id, sequence_no, datetime.now(UTC)))
        )
    console = Console(record=True, width=200)
    console.print(view.render())
    text = console.export_text()
    assert "cycle 5, waiting (running): waiting for the experiment" in text
    assert "job job-7: running, GPUs 0, 1" in text and "step 20 val_loss=0.47" in text
    assert "best val_loss: 0.4 (noise floor 0.02)" in text
    assert "keep" in text and "baseline" in text


def test_a_campaign_file_or_a_flag_isolates_the_experiments_network() -> None:
    assert spec_from_settings({"experiment": {"isolate_network": True}}).experiment.isolate_network
    flagged = spec_from_settings(load_settings(None, settings_from_flags(_flags("--isolate-network"))))
    assert flagged.experiment.isolate_network
    assert not spec_from_settings(load_settings(None, settings_from_flags(_flags()))).experiment.isolate_network
    with pytest.raises(SpecError, match=r"experiment\.isolate_network: must be a bool"):
        spec_from_settings({"experiment": {"isolate_network": "yes"}})


def test_the_html_report_shows_a_models_markup_as_text_and_needs_nothing_outside_the_file() -> None:
    from quarry.cli.lab.report import to_html

    markdown = "# Report\n\n<script>alert(1)</script> and <img src=x onerror=alert(2)>\n\n"
    markdown += "| a | b |\n|---|---|\n| 1 | 2 |\n"
    page = to_html(markdown, '<svg xmlns="http://www.w3.org/2000/svg"></svg>', title="<b>t</b>")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img" not in page and "<title>&lt;b&gt;t&lt;/b&gt;</title>" in page
    assert "<table>" in page and '<svg xmlns="http://www.w3.org/2000/svg"></svg>' in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # no remote resource
