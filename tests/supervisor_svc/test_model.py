"""Run domain types read, and hash, what earlier versions stored."""

from __future__ import annotations

from supervisor_svc.model import RunOptions, RunUsage, StartRequest


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
    usage = RunUsage.from_json(stored)
    assert usage.total.tokens == 20 and usage.total.model_calls == 3
    assert usage.to_json() == stored
