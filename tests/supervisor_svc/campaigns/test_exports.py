"""The workspace exports: rendered from the records, one line per experiment, the journals as Markdown."""

from __future__ import annotations

from quarry.records.campaign import (
    CampaignRecord,
    DeadEnd,
    Decision,
    Directive,
    Insight,
    Verdict,
    record_from_json,
)
from supervisor_svc.campaigns.exports import (
    dead_ends_markdown,
    experiments_jsonl,
    insights_markdown,
    workspace_exports,
)
from tests.supervisor_svc.campaigns.ledger import baseline, run

LEDGER = [*baseline(1, 0.49, 0.50, 0.51), run(4, Verdict.KEEP, 0.46), run(5, Verdict.FAILED)]
RECORDS: list[CampaignRecord] = [
    *LEDGER[:4],
    DeadEnd(cycle=4, approach="a learning rate of 1.0", reason="the loss diverged\nafter 20 steps"),
    Decision(cycle=4, text="lower the learning rate"),
    Directive(text="try a cosine schedule", request_id="a"),
    LEDGER[4],
    Insight(cycle=5, text="  the loss is flat after 300 steps  "),
]


def test_experiments_jsonl_is_one_line_per_ledger_record_as_stored() -> None:
    lines = experiments_jsonl(RECORDS).splitlines()
    assert [record_from_json(line) for line in lines] == LEDGER
    assert experiments_jsonl(RECORDS).endswith("\n")
    assert experiments_jsonl([]) == ""


def test_dead_ends_list_what_was_tried_and_why_it_failed() -> None:
    assert dead_ends_markdown(RECORDS) == (
        "# Dead ends\n\n"
        "Approaches that failed. The campaign never retries them. "
        "Generated from the campaign's records after each cycle; edits here are overwritten.\n\n"
        "## Cycle 4\n\n"
        "**Tried:** a learning rate of 1.0\n\n"
        "**Why it failed:** the loss diverged\nafter 20 steps\n"
    )


def test_insights_list_each_observation_by_cycle() -> None:
    markdown = insights_markdown([*RECORDS, Insight(cycle=9, text="batch size 64 is as good as 128")])
    assert markdown.startswith("# Insights\n\nDurable observations the campaign made.")
    assert markdown.endswith(
        "## Cycle 5\n\nthe loss is flat after 300 steps\n\n## Cycle 9\n\nbatch size 64 is as good as 128\n"
    )


def test_empty_journals_say_so() -> None:
    assert dead_ends_markdown(LEDGER).endswith("overwritten.\n\nNone recorded yet.\n")
    assert insights_markdown([]).endswith("overwritten.\n\nNone recorded yet.\n")


def test_the_exports_are_the_three_files_regenerated_whole_in_a_folder_git_ignores() -> None:
    exports = workspace_exports(RECORDS)
    ignore = exports.pop(".campaign/.gitignore")
    assert exports == {
        ".campaign/experiments.jsonl": experiments_jsonl(RECORDS),
        ".campaign/DEAD_ENDS.md": dead_ends_markdown(RECORDS),
        ".campaign/INSIGHTS.md": insights_markdown(RECORDS),
    }
    # Everything in the folder, its own .gitignore too: no commit ever stages a journal.
    assert [line for line in ignore.splitlines() if not line.startswith("#")] == ["*"]
    assert next(iter(workspace_exports(RECORDS))) == ".campaign/.gitignore"  # written before the journals
    assert workspace_exports(RECORDS) == {".campaign/.gitignore": ignore, **exports}
