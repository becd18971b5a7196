"""What a person following a run reads of each scratchpad entry: a ledger record's headline, never its JSON."""

from __future__ import annotations

from datetime import UTC, datetime

from quarry.identity import Principal, Role
from quarry.records.research import Assignment, RouteDecision, TaskKind, UsageObserved
from quarry.v1 import supervisor_pb2
from quarry.vocabulary import Entry, EntryKind, Tier
from supervisor_svc.runs.events import preview, scratchpad_entry

DELEGATION = "run-58c313c77b0ac3477f2a9e0c1d2b3a4f.2.call_abc"
SUPERVISOR = Principal("run-58c313c77b0ac3477f2a9e0c1d2b3a4f", Role.SUPERVISOR)


def entry(kind: EntryKind, content: str) -> Entry:
    return Entry("thread", 11, kind, SUPERVISOR, content, (), datetime(2026, 12, 7, tzinfo=UTC))


def test_ledger_entries_are_previewed_as_short_human_lines() -> None:
    usage = UsageObserved(delegation_id=DELEGATION, input_tokens=1200, output_tokens=34, model_calls=3)
    route = RouteDecision(delegation_id=DELEGATION, worker_id="worker-1", tier=Tier.WORKER, model="qwen3-8b")
    assignment = Assignment(
        delegation_id=DELEGATION,
        role=Role.RESEARCHER,
        task_kind=TaskKind.RESEARCH,
        objective="Find when the Eiffel Tower opened to the public, and who was its first visitor of note " * 3,
    )
    assert preview(entry(EntryKind.USAGE, usage.model_dump_json())) == "call_abc: 1,234 tokens in 3 model call(s)"
    assert preview(entry(EntryKind.ROUTE, route.model_dump_json())) == "call_abc on worker-1, worker tier (qwen3-8b)"
    shown = preview(entry(EntryKind.ASSIGNMENT, assignment.model_dump_json()))
    assert shown.startswith("researcher call_abc: Find when the Eiffel Tower opened") and shown.endswith("…")
    assert len(shown) < 120 and "{" not in shown
    stored = scratchpad_entry(entry(EntryKind.USAGE, usage.model_dump_json())).stored("run-1", 11, datetime.now(UTC))
    assert supervisor_pb2.RunEvent.FromString(stored).scratchpad.preview == "call_abc: 1,234 tokens in 3 model call(s)"


def test_prose_is_cut_at_a_word_and_a_record_that_does_not_parse_is_shown_as_written() -> None:
    long = "word " * 200
    cut = preview(entry(EntryKind.FINDING, long))
    assert cut.endswith("word…") and len(cut) <= 501
    assert preview(entry(EntryKind.USAGE, '{"kind": "usage_observed"}')) == '{"kind": "usage_observed"}'
