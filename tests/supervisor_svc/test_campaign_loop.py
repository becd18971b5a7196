"""The campaign loop end to end over real gRPC, on the lab of tests/supervisor_svc/campaign_lab.py.

One campaign of six cycles: the unchanged baseline three times (the noise floor), an improvement beyond the noise
kept (its commit stays on the campaign's branch), a regression discarded (the workspace back at the kept commit,
file and HEAD), a crashing experiment recorded FAILED with a dead end and no metric; a directive read by one
THINK only; and no model call while any job ran. Then: a supervisor restarted mid-experiment (in this process)
finds the job again; a THINK interrupted is redone; a retest inside the noise; research before the change;
stagnation and the phase gate; the limiter's sleep; a job over its time limit; a workspace refused.
The same decisions run in milliseconds on in-memory ports in tests/supervisor_svc/campaigns/test_cycle.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from quarry.cli.lab.report import report as lab_report
from quarry.config import MonitorSettings
from quarry.v1 import campaign_pb2, common_pb2, monitor_pb2, scratchpad_pb2
from tests.fakes.choreography import append_finding
from tests.fakes.openai_server import Await, Call, Reply, ScriptedModel
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.campaign_lab import (
    BASELINE,
    BASELINE_CONFIG,
    BETTER_CONFIG,
    BROKEN_CONFIG,
    DIRECTIVE,
    DISCARD,
    FAILED,
    KEEP,
    RETEST,
    WORSE_CONFIG,
    Lab,
    assert_measured_kept_and_discarded,
    git,
    make_project,
    open_lab,
    run_campaign,
    script_keep_then_discard,
    spec,
)


@pytest.fixture
async def lab(tmp_path: Path, model: ScriptedModel, site: FixtureWeb) -> AsyncIterator[Lab]:
    roots = tmp_path / "roots"
    project = make_project(roots)
    monitor_settings = MonitorSettings(
        address="127.0.0.1:0", allow_job_submission=True, workspace_roots=[str(roots.resolve())]
    )
    async with open_lab(tmp_path, model, project, monitor_settings, web=f"127.0.0.1:{site.port}") as opened:
        yield opened


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
    # The journals, current after the campaign stopped (kept and discarded cycles reset the workspace between):
    # every dead end, and one line per ledger record, in a folder git never sees, so nothing committed them.
    journals = project / ".campaign"
    assert "Fewer steps save time." in (journals / "DEAD_ENDS.md").read_text()
    lines = (journals / "experiments.jsonl").read_text().splitlines()
    assert [json.loads(line)["cycle"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert git(project, "status", "--porcelain") == ""
    assert git(project, "log", "--all", "--oneline", "--", ".campaign") == ""

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


def _cite_what_research_promoted(body: dict[str, Any]) -> Reply:
    """The leader's insight, citing the entries its research's result named."""
    result = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")
    found = re.search(r"\(entries ([0-9, ]+);", result)
    assert found, result
    cites = [int(n) for n in found.group(1).split(", ")]
    return Reply(calls=(Call("record_insight", {"text": INSIGHT, "cites": cites}, "i"),))


INSIGHT = "Steps up to 1/L converge fastest on this quadratic."
STEP_SIZES = (
    "<html><head><title>Step sizes</title></head>"
    "<body><p>Gradient descent converges for step sizes up to 1/L.</p></body></html>"
)
STEP_QUOTE = "Gradient descent converges for step sizes up to 1/L"


async def test_a_leader_has_the_literature_researched_records_the_insight_with_its_source_and_the_change_is_run(
    lab: Lab, site: FixtureWeb
) -> None:
    script = lab.script
    page = site.add("/step-sizes.html", STEP_SIZES)
    script.leader.extend(
        [
            Reply(calls=(Call("delegate_research", {"objective": RESEARCH, "criteria": ["cite a step size"]}, "r"),)),
            _cite_what_research_promoted,
            Reply(calls=(Call("delegate_engineer", {"change": "Set lr to 0.1 in config.json."}, "e"),)),
            Reply(content="A larger learning rate converges faster."),
        ]
    )
    script.researchers.add(
        RESEARCH,
        Reply(calls=(Call("read_web_page", {"url": page}, "p"),)),
        Reply(calls=(append_finding("f", "Step sizes up to 1/L converge.", page, STEP_QUOTE),)),
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
    assert len(seen) == 1 and RESEARCH_SUMMARY in seen[0] and "findings promoted: 1 (entries" in seen[0]
    # Then the cycle went on as usual: the engineer's change committed, run and kept.
    rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
    assert [row.verdict for row in rows] == [BASELINE, BASELINE, KEEP]
    assert git(lab.project, "show", f"{rows[2].commit}:config.json") + "\n" == BETTER_CONFIG
    # The research's usage counts in the cycle's tokens; its finding is on the campaign's thread, and the
    # leader's insight cites it with the page and the quote the researcher read.
    assert rows[2].tokens_used >= 1500
    entries = await lab.scratchpad.read_all(campaign.campaign_id)
    [finding] = [e for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_FINDING]
    [insight] = [json.loads(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_CAMPAIGN_INSIGHT]
    assert insight["text"] == INSIGHT and insight["cycle"] == 3
    assert insight["sources"] == [{"finding_ref": finding.sequence_no, "url": page, "excerpt": STEP_QUOTE}]
    assert STEP_QUOTE in (lab.project / ".campaign" / "INSIGHTS.md").read_text()
    # Both delegations went through the run's delegation desk: each assigned, routed and its usage recorded.
    assigned = [json.loads(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_ASSIGNMENT]
    assert [(a["role"], a["objective"]) for a in assigned] == [
        ("researcher", RESEARCH),
        ("engineer", "Set lr to 0.1 in config.json."),
    ]
    delegations = {a["delegation_id"] for a in assigned}
    for kind in (scratchpad_pb2.ENTRY_KIND_ROUTE, scratchpad_pb2.ENTRY_KIND_USAGE):
        assert {json.loads(e.content)["delegation_id"] for e in entries if e.kind == kind} == delegations, kind


PAPER = (
    "<html><head><title>Fast Step Sizes</title></head><body><h1>Fast Step Sizes</h1>"
    "<h2>1 Introduction</h2><p>We ask which step size makes gradient descent fastest on quadratics.</p>"
    "<h2>3 Method</h2><p>We sweep the step size over a grid on 40 random quadratics.</p>"
    "<h2>4 Results</h2><p>A step of 1/L halves the iterations against 0.5/L.</p>"
    "<h2>5 Limitations</h2><p>Our quadratics are all well conditioned.</p></body></html>"
)
ANALYSIS = [
    ("problem", "Which step size is fastest on quadratics.", "which step size makes gradient descent fastest", "1"),
    ("method", "A grid sweep on 40 random quadratics.", "We sweep the step size over a grid on 40", "3"),
    ("result", "1/L halves the iterations against 0.5/L.", "A step of 1/L halves the iterations against 0.5/L", "4"),
    ("limitation", "Only well-conditioned quadratics.", "Our quadratics are all well conditioned", "5"),
]


async def test_a_leader_has_a_paper_analysed_into_quoted_records_then_the_change_is_run(
    lab: Lab, site: FixtureWeb
) -> None:
    script = lab.script
    paper = site.add("/fast-step-sizes.html", PAPER)
    script.leader.extend(
        [
            Reply(
                calls=(
                    Call("analyze_paper", {"paper": "not a paper"}, "bad"),
                    Call("analyze_paper", {"paper": paper, "focus": "the fastest step size"}, "a"),
                )
            ),
            Reply(calls=(Call("delegate_engineer", {"change": "Set lr to 0.1 in config.json."}, "e"),)),
            Reply(content="A step of 1/L is fastest."),
        ]
    )
    records = [
        {"kind": kind, "statement": statement, "quote": quote, "location": f"section {section}"}
        for kind, statement, quote, section in ANALYSIS
    ]
    script.researchers.add(
        f"Analyse the paper at {paper}.",
        Reply(calls=(Call("read_web_page", {"url": paper}, "read"),)),
        Reply(calls=(Call("submit_extracted_evidence", {"source_url": paper, "records": records}, "submit"),)),
    )
    script.engineer.extend(
        [
            Reply(calls=(Call("write_file", {"path": "config.json", "content": BETTER_CONFIG}, "w"),)),
            Reply(content="config.json now says lr 0.1"),
        ]
    )
    message = spec(lab.project, cycles=3)
    message.signals.CopyFrom(campaign_pb2.CampaignSignalRules(baseline_runs=2))
    campaign = await lab.campaigns.start_campaign(message, request_id="lab-paper")
    stream = [event async for event in lab.campaigns.stream_campaign(campaign.campaign_id)]

    assert stream[-1].ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED, stream[-1].ended.reason
    # The extractor was given the paper's text as its one input, and the analysis the campaign wants.
    (asked, *_) = script.researchers.requests[f"Analyse the paper at {paper}."]
    task = next(m["content"] for m in asked["messages"] if m["role"] == "user")
    assert "What the campaign wants from it: the fastest step size" in task and "- one record of kind problem" in task
    # The leader saw each record with its kind, its location and its quote; a name that is no paper was refused.
    seen = {m["tool_call_id"]: m["content"] for m in script.leader_requests[1]["messages"] if m["role"] == "tool"}
    assert "'not a paper' is not an arXiv id, a DOI or the URL of a paper's text" in seen["bad"]
    assert seen["a"].startswith(f"{paper}, recorded as entry ")
    assert '- result: 1/L halves the iterations against 0.5/L. (section 4: "A step of 1/L halves' in seen["a"]
    assert "- limitation: Only well-conditioned quadratics." in seen["a"]
    # The records are evidence on the campaign's thread, by an extractor; the cycle went on and kept the change.
    entries = await lab.scratchpad.read_all(campaign.campaign_id)
    [evidence] = [e for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_EVIDENCE]
    assert evidence.author.role == common_pb2.ROLE_EXTRACTOR
    assert [r["kind"] for r in json.loads(evidence.content)["records"]] == ["problem", "method", "result", "limitation"]
    rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
    assert [row.verdict for row in rows] == [BASELINE, BASELINE, KEEP]


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


def _task(body: dict[str, Any]) -> str:
    return "\n".join(m.get("content") or "" for m in body["messages"] if m["role"] == "user")


def _kept_figure(body: dict[str, Any]) -> str:
    """The kept cycle's citation, as the writer's task gives it."""
    found = re.search(r"- (c\d+: val_loss [0-9.e-]+); keep;", _task(body))
    assert found, _task(body)
    return found.group(1)


async def test_the_phase_gate_completes_the_campaign_with_its_report_whose_figures_match_the_ledger(
    lab: Lab, tmp_path: Path
) -> None:
    lab.script.cycle("Set lr to 0.1 in config.json.", BETTER_CONFIG, "A larger learning rate converges faster.")
    # The writer's first draft misquotes the kept result; its repair cites it as the ledger says.
    lab.script.writer.extend(
        [
            Reply(content="## What was kept and why\nThe larger step reached c3: val_loss 0.5, a 99.9% gain."),
            lambda body: Reply(content=f"## What was kept and why\nThe larger step reached {_kept_figure(body)}."),
        ]
    )
    message = spec(lab.project, cycles=10)
    message.signals.CopyFrom(
        campaign_pb2.CampaignSignalRules(baseline_runs=2, phase_gate=0.01, stop_at_phase_gate=True)
    )
    message.write_report_at_end = True
    campaign = await lab.campaigns.start_campaign(message, request_id="lab-gate-report")
    stream = [event async for event in lab.campaigns.stream_campaign(campaign.campaign_id)]

    ended = stream[-1].ended
    assert ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED and "phase gate" in ended.reason
    rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
    assert [row.verdict for row in rows] == [BASELINE, BASELINE, KEEP]
    phases = [event.phase_changed.message for event in stream if event.HasField("phase_changed")]
    assert phases[-1] == "writing the campaign's report"
    # The repair turn was told what was wrong, and the report holds its text and code's ledger table.
    repair = _task(lab.script.writer_requests[1])
    assert "'c3: val_loss 0.5': the ledger says c3: val_loss" in repair and "'99.9'" in repair
    report = await lab.campaigns.get_campaign_report(campaign.campaign_id)
    kept = f"c3: val_loss {rows[2].metrics[0].value:.6g}"
    assert report.checked and list(report.problems) == [] and report.cycles == 3
    assert f"The larger step reached {kept}." in report.markdown
    assert (
        f"| c3 | keep | {rows[2].metrics[0].value:.6g} | A larger learning rate converges faster. |" in report.markdown
    )
    assert report.tokens_used > 0
    # Written once: its usage is on the campaign, and `quarry lab report` serves it (HTML, with the plot inline).
    assert (await lab.campaigns.get_campaign(campaign.campaign_id)).usage.tokens >= report.tokens_used
    page = tmp_path / "report.html"
    assert await lab_report(lab.campaigns, campaign.campaign_id, page, new=False, request_id="") == 0
    html = page.read_text()
    assert f"The larger step reached {kept}." in html and "<svg" in html and "<script" not in html
    assert len(lab.script.writer_requests) == 2


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


async def test_a_campaign_a_human_stops_gets_its_report_when_its_spec_asks_for_one(lab: Lab) -> None:
    def cite_the_baseline(body: dict[str, Any]) -> Reply:
        found = re.search(r"- (baseline: val_loss [0-9.e-]+)", _task(body))
        assert found, _task(body)
        return Reply(content=f"## Best result against the baseline\nOnly the baseline ran: {found.group(1)}.")

    lab.script.writer.append(cite_the_baseline)
    message = spec(lab.project, cycles=10)
    message.budgets.max_cycles_per_hour = 2  # two baseline runs, then it sleeps
    message.signals.CopyFrom(campaign_pb2.CampaignSignalRules(baseline_runs=2))
    message.write_report_at_end = True
    campaign = await lab.campaigns.start_campaign(message, request_id="lab-stop-report")
    async for event in lab.campaigns.stream_campaign(campaign.campaign_id):
        if event.HasField("sleeping"):
            break
    stopped = await lab.campaigns.stop_campaign(campaign.campaign_id, reason="enough for tonight")
    assert stopped.state == campaign_pb2.CAMPAIGN_STATE_STOPPED

    report = None
    for _ in range(100):  # written in the background: up to 10 s
        try:
            report = await lab.campaigns.get_campaign_report(campaign.campaign_id)
            break
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND, error
            await asyncio.sleep(0.1)
    assert report is not None and report.checked and report.cycles == 2, report
    assert "Only the baseline ran: baseline: val_loss " in report.markdown
    again = await lab.campaigns.stop_campaign(campaign.campaign_id)  # a no-op, and no second report
    assert again.state == campaign_pb2.CAMPAIGN_STATE_STOPPED
    await asyncio.sleep(0.5)
    assert len(lab.script.writer_requests) == 1


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


async def test_a_protected_file_a_command_made_is_a_violation_and_the_campaign_stops_for_a_human(lab: Lab) -> None:
    """The engineer writes no file itself: it runs commands. The sandbox keeps the protected files that exist
    read-only, so rewriting train.py fails; but a new file under a protected glob cannot be bound read-only
    before it exists. What git says the commit changed is what the scan checks, so it is flagged all the same.
    The change is worse, so it is discarded; the monitor never changes a protected path, so it will not reset
    the file away either: the campaign pauses, naming it, for a human to look at."""
    rewrite = "import pathlib; p = pathlib.Path('train.py'); p.write_text('print(0)')"
    create = "import pathlib; pathlib.Path('labels.csv').write_text('x,y')"
    worse = f"import pathlib; pathlib.Path('config.json').write_text({WORSE_CONFIG!r})"
    seen: list[str] = []

    def engineer_reads_its_results(body: dict[str, Any]) -> Reply:
        seen.extend(m["content"] for m in body["messages"] if m["role"] == "tool")
        return Reply(content="labels.csv is there; train.py is read-only.")

    lab.script.leader.extend(
        [
            Reply(calls=(Call("delegate_engineer", {"change": "Cache the labels."}, "e"),)),
            Reply(content="Cached labels speed up training."),
        ]
    )
    lab.script.engineer.extend(
        [
            Reply(
                calls=tuple(
                    Call("run_command", {"command": f'{sys.executable} -c "{code}"'}, f"c{n}")
                    for n, code in enumerate((rewrite, create, worse))
                )
            ),
            engineer_reads_its_results,
        ]
    )
    message = spec(lab.project, cycles=3)
    message.brief.protected_paths.append("*.csv")
    message.signals.CopyFrom(campaign_pb2.CampaignSignalRules(baseline_runs=2))
    campaign = await lab.campaigns.start_campaign(message, request_id="lab-command-violation")
    stream: list[campaign_pb2.CampaignEvent] = []
    async for event in lab.campaigns.stream_campaign(campaign.campaign_id):  # a paused campaign's stream goes on
        stream.append(event)
        if event.HasField("paused"):
            break

    assert "Read-only file system: 'train.py'" in seen[0], seen
    assert seen[1].startswith("completed") and seen[2].startswith("completed"), seen
    found = [event.violation for event in stream if event.HasField("violation")]
    assert [(v.cycle, v.rule, v.subject) for v in found] == [
        (3, campaign_pb2.VIOLATION_RULE_PROTECTED_PATH_TOUCHED, "labels.csv")
    ]
    entries = await lab.scratchpad.read_all(campaign.campaign_id)
    decisions = [json.loads(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_CAMPAIGN_DECISION]
    assert [d["rule"] for d in decisions if d["kind"] == "violation"] == ["protected_path_touched"]
    reason = stream[-1].paused.reason
    assert "labels.csv is read-only" in reason and "'*.csv'" in reason, reason
    assert (lab.project / "labels.csv").read_text() == "x,y"


@pytest.mark.parametrize(
    ("case", "said"),
    [
        (
            "jobs refused",
            "does not run jobs, so the campaign could never run its experiment: set "
            "QUARRY_MONITOR_ALLOW_JOB_SUBMISSION=true where the monitor runs",
        ),
        ("root elsewhere", "add a directory above it to QUARRY_MONITOR_WORKSPACE_ROOTS"),
        ("not a repository", "make it a git repository (`git init`, then commit the code)"),
    ],
)
async def test_a_campaign_the_monitor_cannot_serve_is_refused_at_start_naming_what_to_change(
    tmp_path: Path, model: ScriptedModel, case: str, said: str
) -> None:
    roots = tmp_path / "roots"
    project = make_project(roots)
    if case == "not a repository":
        project = roots / "plain"
        project.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monitor_settings = MonitorSettings(
        address="127.0.0.1:0",
        allow_job_submission=case != "jobs refused",
        workspace_roots=[str((elsewhere if case == "root elsewhere" else roots).resolve())],
    )
    async with open_lab(tmp_path, model, project, monitor_settings) as lab:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await lab.campaigns.start_campaign(spec(project, cycles=3), request_id=f"refused-{case.split()[0]}")
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert said in (refused.value.details() or "")
        assert (await lab.campaigns.list_campaigns()).campaigns == [], "nothing was accepted, so nothing pauses"
        assert lab.script.times == [], "no model was asked"
