"""The memory THINK reads: the frozen brief, a capped log of milestones and decisions, bounded lists."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quarry.records.campaign import (
    CampaignRecord,
    DeadEnd,
    Decision,
    Directive,
    DirectiveConsumed,
    Insight,
    TrialRecord,
    Verdict,
)
from quarry.records.signals import SignalRules, read_signals
from supervisor_svc.campaigns.memory import (
    DEAD_ENDS_CAP,
    DECISIONS_KEPT,
    INSIGHTS_CAP,
    LINE_CAP,
    LOG_CAP,
    MILESTONES_CAP,
    RECENT_EXPERIMENTS_CAP,
    memory_view,
    pending_directives,
    think_briefing,
)
from tests.supervisor_svc.campaigns.ledger import LOSS, baseline, run

BRIEF = "Goal: lower val_loss of train.py.\nConstraints: do not touch data/.\n" * 3
BASELINE = baseline(1, 0.49, 0.50, 0.51)


def sections(log: str) -> tuple[str, str]:
    milestones, _, decisions = log.partition("\n\nLatest decisions:\n")
    return milestones, decisions


def test_milestones_are_the_baseline_batches_and_the_kept_improvements() -> None:
    records: list[CampaignRecord] = [
        *BASELINE,
        run(4, Verdict.DISCARD, 0.52),
        run(5, Verdict.KEEP, 0.46, hypothesis="a lower learning rate"),
        Decision(cycle=5, text="keep lowering the learning rate"),
    ]
    view = memory_view(BRIEF, records, LOSS)
    milestones, decisions = sections(view.log)
    assert milestones.splitlines() == [
        "Milestones:",
        "cycles 1-3: baseline val_loss 0.5 over 3 runs at base",
        "cycle 5: kept val_loss 0.46 at c005: a lower learning rate",
    ]
    assert decisions == "cycle 5: keep lowering the learning rate"


def test_an_empty_campaign_has_an_empty_log() -> None:
    assert memory_view(BRIEF, [], LOSS).log == "Milestones:\n(none yet)\n\nLatest decisions:\n(none yet)"


def test_the_brief_is_given_as_written_and_outside_the_cap() -> None:
    brief = "constitution " * 1_000
    view = memory_view(brief, [Decision(cycle=1, text="d")], LOSS)
    assert view.brief == brief
    assert len(view.log) < LOG_CAP


def test_the_milestones_keep_the_newest_within_their_cap_and_count_the_rest() -> None:
    keeps = [run(cycle, Verdict.KEEP, 1 / cycle, hypothesis=f"idea {cycle} " + "x" * 100) for cycle in range(1, 41)]
    milestones, _ = sections(memory_view(BRIEF, keeps, LOSS).log)
    assert len(milestones) <= MILESTONES_CAP
    lines = milestones.splitlines()
    shown = len(lines) - 2  # the title and the marker
    assert lines[1] == f"[{40 - shown} older milestones left out]"
    assert lines[-1].startswith("cycle 40: kept")
    assert lines[2].startswith(f"cycle {40 - shown + 1}: kept")
    assert len(milestones) > MILESTONES_CAP - 130  # as many as fit, not fewer


def test_only_the_latest_decisions_are_kept() -> None:
    decisions = [Decision(cycle=cycle, text=f"decision {cycle}") for cycle in range(1, 21)]
    _, latest = sections(memory_view(BRIEF, decisions, LOSS).log)
    lines = latest.splitlines()
    assert lines[0] == f"[{20 - DECISIONS_KEPT} older decisions left out]"
    assert lines[1:] == [f"cycle {cycle}: decision {cycle}" for cycle in range(21 - DECISIONS_KEPT, 21)]


def test_one_long_line_is_cut_to_a_line() -> None:
    view = memory_view(BRIEF, [Decision(cycle=1, text="why\n" + "because " * 1_000)], LOSS)
    _, latest = sections(view.log)
    assert len(latest) == LINE_CAP
    assert latest.startswith("cycle 1: why because")
    assert latest.endswith("…")


def test_full_sections_leave_the_whole_log_within_its_cap() -> None:
    records: list[CampaignRecord] = [
        *[run(cycle, Verdict.KEEP, 0.5, hypothesis="k" * 400) for cycle in range(1, 30)],
        *[Decision(cycle=cycle, text="d" * 400) for cycle in range(1, 30)],
    ]
    milestones, latest = sections(memory_view(BRIEF, records, LOSS).log)
    assert len(memory_view(BRIEF, records, LOSS).log) <= LOG_CAP
    assert len(milestones) <= MILESTONES_CAP
    assert latest.splitlines()[0].endswith("older decisions left out]")


text = st.text(max_size=600)
any_record = st.one_of(
    st.builds(lambda c, h: run(c, Verdict.KEEP, 0.1, hypothesis=h or "h"), st.integers(1, 500), text),
    st.builds(lambda c, v: run(c, Verdict.BASELINE, v), st.integers(1, 500), st.floats(-1e9, 1e9)),
    st.builds(lambda c, h: run(c, Verdict.DISCARD, 0.2, hypothesis=h or "h"), st.integers(1, 500), text),
    st.builds(lambda c, t: Decision(cycle=c, text=t), st.integers(1, 500), text),
    st.builds(lambda c, a, r: DeadEnd(cycle=c, approach=a, reason=r), st.integers(1, 500), text, text),
    st.builds(lambda c, t: Insight(cycle=c, text=t), st.integers(1, 500), text),
)


@settings(max_examples=150, deadline=None)
@given(records=st.lists(any_record, max_size=80))
def test_every_part_stays_within_its_cap_whatever_the_records(records: list[CampaignRecord]) -> None:
    view = memory_view(BRIEF, records, LOSS)
    assert len(view.log) <= LOG_CAP
    assert len(sections(view.log)[0]) <= MILESTONES_CAP
    assert view == memory_view(BRIEF, records, LOSS)
    ledger = [record for record in records if isinstance(record, TrialRecord)]
    context = think_briefing(BRIEF, records, read_signals(ledger, LOSS, SignalRules()))
    assert len(context.recent_experiments) <= RECENT_EXPERIMENTS_CAP
    assert len(context.dead_ends) <= DEAD_ENDS_CAP
    assert len(context.insights) <= INSIGHTS_CAP
    assert all(len(line) <= LINE_CAP for part in (view.log, context.dead_ends) for line in part.splitlines())


def test_think_sees_the_latest_experiments_and_all_it_must_not_retry() -> None:
    ledger = [*BASELINE, *[run(cycle, Verdict.DISCARD, 0.52, conclusion="worse") for cycle in range(4, 16)]]
    records: list[CampaignRecord] = [
        *ledger,
        DeadEnd(cycle=4, approach="a learning rate of 1.0", reason="diverged"),
        Insight(cycle=5, text="the loss is flat after 300 steps"),
    ]
    context = think_briefing(BRIEF, records, read_signals(ledger, LOSS, SignalRules()))
    lines = context.recent_experiments.splitlines()
    assert lines[0] == "[5 older experiments left out]"
    assert lines[-1] == "cycle 15 DISCARD (val_loss=0.52, job completed) at c015: hypothesis 15 -> worse"
    assert len(lines) == 11
    assert context.dead_ends == "cycle 4: a learning rate of 1.0 -- diverged"
    assert context.insights == "cycle 5: the loss is flat after 300 steps"
    assert "noise floor" in context.signals
    assert context.memory == memory_view(BRIEF, records, LOSS, before_cycle=5)


def test_the_log_gives_the_decisions_before_the_recent_experiments_instead_of_repeating_them() -> None:
    ledger = [*BASELINE]
    records: list[CampaignRecord] = [*BASELINE]
    for cycle in range(4, 31):
        records.append(Decision(cycle=cycle, text=f"decision {cycle}"))
        trial = run(cycle, Verdict.DISCARD, 0.52, hypothesis=f"decision {cycle}")
        ledger.append(trial)
        records.append(trial)
    context = think_briefing(BRIEF, records, read_signals(ledger, LOSS, SignalRules()))
    _, decisions = sections(context.memory.log)
    shown = [line for line in context.recent_experiments.splitlines() if line.startswith("cycle ")]
    first_recent = int(shown[0].split()[1])
    assert shown[-1].startswith("cycle 30 ")
    assert decisions.splitlines()[-1] == f"cycle {first_recent - 1}: decision {first_recent - 1}"
    assert not any(f"decision {cycle}" in decisions for cycle in range(first_recent, 31))


def test_the_oldest_dead_ends_are_left_out_first_and_counted() -> None:
    dead_ends = [DeadEnd(cycle=cycle, approach=f"approach {cycle}", reason="r" * 200) for cycle in range(1, 31)]
    context = think_briefing(BRIEF, dead_ends, read_signals([], LOSS, SignalRules()))
    lines = context.dead_ends.splitlines()
    assert lines[0] == f"[{30 - (len(lines) - 1)} older dead ends left out]"
    assert lines[-1].startswith("cycle 30: approach 30")
    assert len(context.dead_ends) <= DEAD_ENDS_CAP


def test_a_directive_is_pending_until_consumed_and_listed_once() -> None:
    first = Directive(text="try a cosine schedule", request_id="a")
    second = Directive(text="stop tuning the batch size", request_id="b")
    records: list[CampaignRecord] = [first, second, Directive(text="try a cosine schedule", request_id="a")]
    assert pending_directives(records) == (first, second)
    consumed: list[CampaignRecord] = [*records, DirectiveConsumed(request_id="a", cycle=3)]
    assert pending_directives(consumed) == (second,)
    assert pending_directives([*consumed, DirectiveConsumed(request_id="b", cycle=4)]) == ()


def test_the_rendered_context_has_every_part() -> None:
    records: list[CampaignRecord] = [*BASELINE, Directive(text="try a cosine schedule", request_id="a")]
    rendered = think_briefing(BRIEF, records, read_signals(BASELINE, LOSS, SignalRules())).render()
    assert rendered.startswith(f"## Brief\n{BRIEF}")
    for part in ("## Memory\nMilestones:", "## Signals\nmetric: val_loss", "## Recent experiments\ncycle 1 BASELINE"):
        assert part in rendered
    assert "## Dead ends (never retry these)\n(none yet)" in rendered
    assert rendered.endswith("(follow them this cycle)\n- try a cosine schedule")
