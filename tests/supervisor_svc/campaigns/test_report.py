"""The campaign report's figure check and Markdown, on ledgers written by hand (no service, no model)."""

from __future__ import annotations

from quarry.records.campaign import CampaignRecord, DeadEnd, Verdict
from quarry.records.signals import read_signals
from supervisor_svc.campaigns.report import ReportFacts, check_figures, render, writer_task
from tests.supervisor_svc.campaigns.fakes import spec
from tests.supervisor_svc.campaigns.ledger import baseline, run

RECORDS: list[CampaignRecord] = [
    *baseline(1, 4.0012, 4.0031),
    run(3, Verdict.KEEP, 0.23149, commit="k3", hypothesis="Set lr to 0.1 in config.json."),
    run(4, Verdict.DISCARD, 8.61, hypothesis="Set lr to 0.001."),
    run(5, Verdict.FAILED, hypothesis="Break | the config."),
    DeadEnd(cycle=5, approach="a broken config", reason="the script crashed"),
]


def facts() -> ReportFacts:
    campaign = spec()
    trials = [record for record in RECORDS if not isinstance(record, DeadEnd)]
    signals = read_signals(trials, campaign.metric.goal, campaign.signal_rules())  # type: ignore[arg-type]
    return ReportFacts.of(campaign, RECORDS, signals)


def test_figures_cited_by_cycle_pass_at_the_precision_written() -> None:
    text = (
        "The kept change (c3: val_loss 0.231, and c3: val_loss 0.23149) beat the baseline "
        "(baseline: val_loss 4.002) well beyond the noise (noise: val_loss=0.0027). "
        "Setting lr to 0.1 is what worked; the regression c4: val_loss 8.61 was discarded after 5 cycles."
    )
    assert check_figures(text, facts()) == []


def test_a_figure_the_ledger_does_not_back_is_named_with_what_the_ledger_says() -> None:
    problems = check_figures("It reached c3: val_loss 0.25 and c5: val_loss 1.0, c9: val_loss 2.0.", facts())
    assert problems == [
        "'c3: val_loss 0.25': the ledger says c3: val_loss 0.23149",
        "'c5: val_loss 1.0': the ledger has no val_loss for c5",
        "'c9: val_loss 2.0': the ledger has no val_loss for c9",
    ]
    assert check_figures("c3: accuracy 0.23149", facts()) == [
        "'c3: accuracy 0.23149': the campaign's metric is val_loss"
    ]


def test_a_figure_of_the_writers_own_is_refused_unless_the_ledger_says_it() -> None:
    # A 94.2% improvement is the writer's arithmetic; "lr 0.1" is the hypothesis's own words.
    problems = check_figures("An improvement of 94.2% over 4.0 with lr 0.1 (version 1.2.3).", facts())
    assert [problem.split(" ", 1)[0] for problem in problems] == ["'94.2'", "'4.0'"]


def test_the_writers_task_gives_every_figure_as_its_citation() -> None:
    task = writer_task(facts())
    assert "- baseline: val_loss 4.00215" in task
    assert "- c3: val_loss 0.23149; keep; Set lr to 0.1 in config.json." in task
    assert "- c5: no val_loss (failed); failed; Break | the config." in task
    assert "Dead end after c5: a broken config: the script crashed" in task


def test_the_markdown_has_the_prose_and_codes_ledger_table_or_says_why_the_prose_is_left_out() -> None:
    checked = render(facts(), "## Brief\nLower it.", [])
    assert "## Brief\nLower it." in checked
    assert "| c3 | keep | 0.23149 | Set lr to 0.1 in config.json. |" in checked
    assert "| c5 | failed | - | Break \\| the config. |" in checked
    assert "- c5: a broken config: the script crashed" in checked
    refused = render(facts(), "", ["'c3: val_loss 0.25': the ledger says c3: val_loss 0.23149"])
    assert "> The writer's text is left out: it did not match the ledger." in refused
    assert "> - 'c3: val_loss 0.25': the ledger says c3: val_loss 0.23149" in refused
    assert "- best: val_loss 0.23149" in refused
