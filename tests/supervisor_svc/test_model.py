"""Run domain types read what earlier versions stored."""

from __future__ import annotations

from supervisor_svc.model import RunOptions, RunUsage


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
    assert RunOptions.from_json(options.to_json()) == options


def test_usage_stored_per_tier_round_trips() -> None:
    stored = {
        "supervisor": {"input_tokens": 10, "output_tokens": 2, "model_calls": 1, "tool_calls": 3},
        "workers": {"input_tokens": 7, "output_tokens": 1, "model_calls": 2, "tool_calls": 0},
    }
    usage = RunUsage.from_json(stored)
    assert usage.total.tokens == 20 and usage.total.model_calls == 3
    assert usage.to_json() == stored
