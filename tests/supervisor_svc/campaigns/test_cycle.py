"""A cycle's decisions, on the in-memory lab, thread, store and THINK (tests/supervisor_svc/campaigns/fakes.py):
measured, kept, discarded, failed with a dead end and a backoff, stopped by a budget, paused when refused, and
re-attached to its job after a restart. tests/supervisor_svc/test_campaign_loop.py runs the same over processes."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import grpc
import pytest

from quarry.compute import MonitorError
from quarry.v1 import campaign_pb2
from quarry.vocabulary import EntryKind, JobState
from supervisor_svc.campaigns.loop import NO_CHANGE, CampaignLoop, LoopSettings
from supervisor_svc.campaigns.spec import Budgets
from supervisor_svc.campaigns.state import CampaignState, Phase
from supervisor_svc.campaigns.store import CampaignLost
from supervisor_svc.campaigns.thread import CampaignThread
from tests.supervisor_svc.campaigns.fakes import (
    CAMPAIGN_ID,
    CONFIG,
    Change,
    FakeHandle,
    FakeLab,
    FakeScratchpad,
    Outcome,
    ScriptedThinking,
    Stopped,
    crash,
    spec,
)

BETTER = Change("A larger learning rate converges faster.", {CONFIG: "better"})
WORSE = Change("A smaller learning rate is more stable.", {CONFIG: "worse"})
BROKEN = Change("Fewer steps save time.", {CONFIG: "broken"})


def outcomes() -> Callable[[Mapping[str, str]], Outcome]:
    """val_loss by config: about 4 unchanged (4.00, then 4.02: a noise floor of about 0.028), 0.5 better, 8 worse;
    a broken config crashes."""
    baselines = iter([4.0, 4.02, 4.01, 4.03])

    def outcome(files: Mapping[str, str]) -> Outcome:
        config = files[CONFIG]
        if config == "broken":
            return crash()
        return Outcome({"base": next(baselines, 4.0), "better": 0.5, "worse": 8.0}[config])

    return outcome


def lab() -> FakeLab:
    return FakeLab(outcomes(), {CONFIG: "base", "train.py": "print(...)"})


def campaign_loop(
    handle: FakeHandle, lab: FakeLab, thinking: ScriptedThinking, scratchpad: FakeScratchpad
) -> CampaignLoop:
    thread = CampaignThread(scratchpad, CAMPAIGN_ID, CAMPAIGN_ID)
    return CampaignLoop(handle, lab.open, thread, thinking, LoopSettings(retry_seconds=0))


async def run(handle: FakeHandle, lab: FakeLab, *changes: Change) -> FakeScratchpad:
    scratchpad = FakeScratchpad()
    await campaign_loop(handle, lab, ScriptedThinking(lab, *changes), scratchpad).run()
    return scratchpad


def records(scratchpad: FakeScratchpad, kind: EntryKind) -> list[dict[str, object]]:
    return [json.loads(entry.content) for entry in scratchpad.threads[CAMPAIGN_ID] if entry.kind is kind]


async def test_the_baseline_sets_the_noise_floor_then_an_improvement_is_kept_and_a_regression_discarded() -> None:
    workspace, handle = lab(), FakeHandle(spec(budgets=Budgets(max_cycles=4)))
    scratchpad = await run(handle, workspace, BETTER, WORSE)

    assert handle.verdicts == ["baseline", "baseline", "keep", "discard"]
    assert handle.ended == (CampaignState.COMPLETED, "4 of 4 cycles run")
    baseline, kept, discarded = handle.rows[0], handle.rows[2], handle.rows[3]
    assert baseline.commit == "c0" and kept.metric("val_loss") == 0.5 and discarded.metric("val_loss") == 8.0
    # The regression's commit is dropped: the workspace is back at the kept commit, files and HEAD.
    assert workspace.branch_name == f"quarry/{CAMPAIGN_ID}"
    assert workspace.resets[-1] == (kept.commit, True)
    assert (workspace.head, workspace.files[CONFIG]) == (kept.commit, "better")
    assert discarded.commit not in {"c0", kept.commit}
    # The noise floor, once the two baseline runs are in; the best from the keep.
    floor = handle.progress[1].noise_floor
    assert floor == pytest.approx(2 * 0.02 / 2**0.5)
    assert [(s.kind, s.value) for s in handle.signals()] == [(campaign_pb2.CAMPAIGN_SIGNAL_KIND_NOISE_FLOOR, floor)]
    assert handle.progress[-1].best_value == 0.5
    # Each row once on the thread and in the store; the experiments exported; THINK only after the baseline.
    assert [r["cycle"] for r in records(scratchpad, EntryKind.CAMPAIGN_LEDGER)] == [1, 2, 3, 4]
    assert len(workspace.exported[".campaign/experiments.jsonl"].splitlines()) == 4
    assert [cycle for phase, cycle, _ in handle.phases if phase is Phase.THINK] == [3, 4]
    assert handle.tokens == 200
    # Each step read the thread once: four cycles, then the step that found the budget spent.
    assert scratchpad.reads == 5


async def test_a_crash_is_a_failed_cycle_with_a_dead_end_and_the_next_cycle_backs_off() -> None:
    workspace, handle = lab(), FakeHandle(spec(budgets=Budgets(max_cycles=10)))
    with pytest.raises(Stopped):
        await run(handle, workspace, BROKEN)

    assert handle.verdicts == ["baseline", "baseline", "failed"]
    crashed = handle.rows[2]
    assert crashed.job_state is JobState.FAILED and crashed.exit_code == 1 and crashed.metric("val_loss") is None
    assert crashed.conclusion == "the job ended failed (exit code 1) without a value for val_loss"
    assert workspace.resets[-1] == ("c0", True)
    assert workspace.files[CONFIG] == "base"
    assert "cooling down 60 s" in handle.slept[0]


async def test_failures_in_a_row_up_to_the_bound_pause_the_campaign() -> None:
    workspace = lab()
    handle = FakeHandle(spec(budgets=Budgets(max_cycles=10, max_consecutive_failures=1)))
    scratchpad = await run(handle, workspace, BROKEN)

    assert handle.verdicts == ["baseline", "baseline", "failed"]
    assert handle.ended is not None and handle.ended[0] is CampaignState.PAUSED
    assert handle.ended[1].startswith("1 cycles failed in a row")
    dead_ends = records(scratchpad, EntryKind.CAMPAIGN_DEAD_END)
    assert [(d["cycle"], d["approach"]) for d in dead_ends] == [(3, BROKEN.hypothesis)]


@pytest.mark.parametrize(
    "change",
    [Change("Nothing to do."), Change("Write the config as it is.", files={CONFIG: "base"})],
    ids=["no-edit", "an-edit-that-changes-nothing"],
)
async def test_a_think_that_leaves_the_workspace_as_it_was_runs_no_job(change: Change) -> None:
    """Whether anything changed is the workspace's to say (git status), not which tools were used: a file
    written back as it was is no change, and no job judges the kept commit against itself."""
    workspace, handle = lab(), FakeHandle(spec(budgets=Budgets(max_cycles=3)))
    scratchpad = await run(handle, workspace, change)

    assert handle.verdicts == ["baseline", "baseline", "failed"]
    failed = handle.rows[2]
    assert (failed.commit, failed.job_id, failed.conclusion) == ("", "", NO_CHANGE)
    assert len(workspace.launched) == 2
    decisions = records(scratchpad, EntryKind.CAMPAIGN_DECISION)
    assert [(d["cycle"], d["commit"]) for d in decisions] == [(3, "")]


async def test_the_token_budget_ends_the_campaign_once_spent() -> None:
    workspace, handle = lab(), FakeHandle(spec(budgets=Budgets(max_tokens=150)))
    thinking = ScriptedThinking(workspace, BETTER, WORSE)
    await campaign_loop(handle, workspace, thinking, FakeScratchpad()).run()

    assert handle.verdicts == ["baseline", "baseline", "keep", "discard"]
    assert handle.ended == (CampaignState.COMPLETED, "200 of 150 tokens used")
    # Each THINK is told what its cycle may spend (THINK then stops before a call that would cross it).
    assert thinking.tokens_left == [150, 50]


async def test_the_thinks_are_briefed_with_the_directive_once() -> None:
    workspace, scratchpad = lab(), FakeScratchpad()
    handle = FakeHandle(spec(budgets=Budgets(max_cycles=4)), directives=["Try a larger learning rate first."])
    thinking = ScriptedThinking(workspace, BETTER, WORSE)
    await campaign_loop(handle, workspace, thinking, scratchpad).run()

    assert [[d.text for d in b.directives] for b in thinking.briefings] == [["Try a larger learning rate first."], []]


async def test_a_loop_restarted_after_its_commit_finds_its_experiment_again_without_thinking() -> None:
    workspace, scratchpad = lab(), FakeScratchpad()
    handle = FakeHandle(spec(budgets=Budgets(max_cycles=3)))
    # The process stops as cycle 3's experiment is launched, its THINK's change committed.
    workspace.interruptions[f"{CAMPAIGN_ID}/c3/job"] = CampaignLost(CAMPAIGN_ID)
    first = ScriptedThinking(workspace, BETTER)
    with pytest.raises(CampaignLost):
        await campaign_loop(handle, workspace, first, scratchpad).run()
    committed = workspace.head

    again = ScriptedThinking(workspace)  # no THINK left: one would fail the test
    await campaign_loop(handle, workspace, again, scratchpad).run()

    assert len(first.briefings) == 1 and again.briefings == []
    assert handle.verdicts == ["baseline", "baseline", "keep"] and handle.rows[2].commit == committed
    assert list(workspace.launches) == [f"{CAMPAIGN_ID}/c{cycle}/job" for cycle in (1, 2, 3)]


async def test_a_refusal_pauses_the_campaign_with_the_services_words() -> None:
    workspace, handle = lab(), FakeHandle(spec())
    workspace.refusal = MonitorError("the root is not allowed", code=grpc.StatusCode.FAILED_PRECONDITION)
    await run(handle, workspace)

    assert handle.ended == (
        CampaignState.PAUSED,
        "a service refused the campaign: FAILED_PRECONDITION: the root is not allowed",
    )
    assert workspace.launched == []


async def test_an_unreachable_service_is_retried_and_the_step_redone_once() -> None:
    workspace, handle = lab(), FakeHandle(spec(budgets=Budgets(max_cycles=2)))
    workspace.refusal = MonitorError("connection refused", code=grpc.StatusCode.UNAVAILABLE)
    await run(handle, workspace)

    assert handle.verdicts == ["baseline", "baseline"]
    assert handle.ended == (CampaignState.COMPLETED, "2 of 2 cycles run")


async def test_a_protected_file_changed_by_a_command_is_a_violation_all_the_same() -> None:
    """The engineer reports no file written (it ran a command that rewrote train.py): the commit's own
    changed paths are what the violation scan checks."""
    workspace, handle = lab(), FakeHandle(spec(budgets=Budgets(max_cycles=3)))
    sneaky = Change("Patch the trainer from a shell.", {"train.py": "print('cheat')"}, by_command=True)
    scratchpad = await run(handle, workspace, sneaky)

    violations = [v for v in records(scratchpad, EntryKind.CAMPAIGN_DECISION) if v["kind"] == "violation"]
    assert [(v["cycle"], v["subject"]) for v in violations] == [(3, "train.py")]
