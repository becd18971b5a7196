"""Run domain types read, and hash, what earlier versions stored."""

from __future__ import annotations

from dataclasses import replace

import pytest

from quarry.errors import InvalidArgument
from quarry.records.research import ClaimJudgement
from supervisor_svc.runs.domain import (
    ACTIVE_STATES,
    Report,
    RunOptions,
    RunState,
    RunUsage,
    StartRequest,
    validate_start,
)


def test_options_stored_under_the_old_field_name_still_read() -> None:
    stored = {
        "max_supervisor_turns": 3,
        "worker_max_turns": 5,
        "max_parallel_delegations": 2,
        "timeout_seconds": 60.0,
        "max_tokens": 1000,
    }
    options = RunOptions.from_json(stored)
    assert options.max_worker_turns == 5 and options.max_supervisor_turns == 3
    assert options.to_json() == stored  # stored as before, so earlier releases read it too


def test_a_request_digest_is_the_one_the_previous_release_computed() -> None:
    # A StartRun retried across an upgrade must still find its run: the digest below is what the
    # release before the field's rename computed for this request.
    options = RunOptions(
        max_supervisor_turns=3, max_worker_turns=5, max_parallel_delegations=2, timeout_seconds=60.0, max_tokens=1000
    )
    request = StartRequest("Why?", options, {"team": "a"}, "req-1")
    assert request.digest() == "3658faca9fd40b2e7032c53b6109e05fce8bf3f137cf86e5c67d821fdbfc0886"


def test_usage_stored_per_tier_round_trips() -> None:
    stored = {
        "supervisor": {"input_tokens": 10, "output_tokens": 2, "model_calls": 1, "tool_calls": 3},
        "workers": {"input_tokens": 7, "output_tokens": 1, "model_calls": 2, "tool_calls": 0},
    }
    usage = RunUsage.from_json(stored)  # as an earlier release stored it, without estimated_calls
    assert usage.total.tokens == 20 and usage.total.model_calls == 3 and usage.total.estimated_calls == 0
    written = usage.to_json()
    assert written == {tier: {**counts, "estimated_calls": 0} for tier, counts in stored.items()}
    assert RunUsage.from_json(written) == usage


def test_options_left_at_their_defaults_keep_the_earlier_digest_and_row() -> None:
    options = RunOptions(max_supervisor_turns=3, max_worker_turns=5, max_parallel_delegations=2, timeout_seconds=60.0)
    old_request = StartRequest("Why?", replace(options, max_tokens=1000), {"team": "a"}, "req-1")
    assert old_request.digest() == "3658faca9fd40b2e7032c53b6109e05fce8bf3f137cf86e5c67d821fdbfc0886"
    assert set(RunOptions().to_json()) == {
        "max_supervisor_turns",
        "worker_max_turns",
        "max_parallel_delegations",
        "timeout_seconds",
        "max_tokens",
    }
    verified = replace(options, verification="off", require_approval=True, max_revision_rounds=3)
    assert RunOptions.from_json(verified.to_json()) == verified
    assert StartRequest("Why?", verified).digest() != StartRequest("Why?", options).digest()
    assert RunOptions.from_json(options.to_json()).verifies(server_default=True)
    assert not RunOptions(verification="off").verifies(server_default=True)
    assert RunOptions(verification="on").verifies(server_default=False)
    assert RunOptions().revision_rounds == 2 and RunOptions(max_revision_rounds=5).revision_rounds == 5


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (RunOptions(max_revision_rounds=9), "options.max_revision_rounds"),
        (RunOptions(max_revision_rounds=-1), "options.max_revision_rounds"),
        (RunOptions(verification="sometimes"), "options.verification"),
    ],
)
def test_verification_options_out_of_bounds_are_field_violations(options: RunOptions, field: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        validate_start(StartRequest("Why?", options))
    assert [violation.field for violation in raised.value.violations] == [field]
    validate_start(StartRequest("Why?", RunOptions(max_revision_rounds=8, verification="on")))


def test_citations_keep_their_judgement_and_earlier_rows_read_without_one() -> None:
    stored = {
        "markdown": "It is tall [1].",
        "citations": [{"number": 1, "url": "https://x", "title": "X", "excerpt": "tall", "sequence_no": 4}],
        "removed_citations": 0,
        "token_budget_exhausted": False,
        "turn_budget_exhausted": False,
    }
    report = Report.from_json(stored)
    assert report.citations[0].judgement is None and report.to_json() == stored
    judged = Report(report.markdown, (replace(report.citations[0], judgement=ClaimJudgement.PARTIALLY_SUPPORTED),))
    assert judged.to_json()["citations"][0]["judgement"] == "partially_supported"
    assert Report.from_json(judged.to_json()) == judged


def test_a_run_awaiting_approval_is_active() -> None:
    assert not RunState.AWAITING_APPROVAL.ended and RunState.AWAITING_APPROVAL.value in ACTIVE_STATES
