"""A run's account and token budget: what each tier used, and the exact edge where the budget is spent."""

from __future__ import annotations

import pytest

from quarry.agent.usage import Usage
from supervisor_svc.runs.budget import RunAccount, TokenBudget

BUDGET = 1_000


def account_at(tokens: int) -> RunAccount:
    """An account whose run used `tokens` in all: some planning, the report and a worker's share."""
    account = RunAccount()
    account.count_planning(lambda: Usage(input_tokens=100, output_tokens=50))
    account.report = Usage(input_tokens=50)
    account.add_worker(Usage(input_tokens=tokens - 200))
    assert account.usage().total.tokens == tokens
    return account


def test_the_account_adds_up_every_tier_and_reads_planning_live() -> None:
    account = RunAccount()
    planning = Usage(input_tokens=10, model_calls=1)
    account.count_planning(lambda: planning)
    account.add_worker(Usage(input_tokens=100, output_tokens=20))
    account.add_worker(Usage(input_tokens=7), verification=True)
    account.report += Usage(output_tokens=3)
    planning = Usage(input_tokens=40, model_calls=2)  # the loop spent more since it was counted
    usage = account.usage()
    assert usage.supervisor == Usage(input_tokens=40, output_tokens=3, model_calls=2)
    assert usage.workers == Usage(input_tokens=107, output_tokens=20)
    assert usage.verification == Usage(input_tokens=7)
    assert usage.total.tokens == 170


@pytest.mark.parametrize(
    ("used", "left", "spent"),
    [(BUDGET - 1, 1, False), (BUDGET, 0, True), (BUDGET + 1, -1, True)],
    ids=["one-under", "at", "one-over"],
)
def test_the_budget_is_spent_once_usage_reaches_it(used: int, left: int, spent: bool) -> None:
    """Intended side: a run whose usage exactly equals its budget has spent it, so no new delegation starts
    (supervisor.proto, RunOptions.max_tokens: "Once reached, no new delegation starts"). One token
    under leaves exactly one token to delegate; one over is spent too (a worker may overrun its share)."""
    budget = TokenBudget(BUDGET, account_at(used))
    assert budget.left() == left
    assert budget.spent() is spent


@pytest.mark.parametrize("used", [0, BUDGET, 10 * BUDGET])
def test_no_budget_is_never_spent_and_bounds_no_share(used: int) -> None:
    budget = TokenBudget(0, account_at(max(used, 200)))
    assert budget.left() is None
    assert not budget.spent()
    assert budget.share(3) == 0  # 0: the worker runs unbounded by tokens


def test_shares_split_what_is_left_and_never_round_down_to_no_bound() -> None:
    """A share is at least 1: 0 would mean "unbounded" to the worker."""
    assert TokenBudget(BUDGET, account_at(400)).share(3) == 200
    assert TokenBudget(BUDGET, account_at(400)).share(0) == 600  # no one else shares it
    assert TokenBudget(BUDGET, account_at(BUDGET - 1)).share(4) == 1
    assert TokenBudget(BUDGET, account_at(BUDGET)).share(1) == 1


def test_a_share_under_one_model_calls_cost_is_not_afforded() -> None:
    """A role started on less than one call's cost fails on the budget after spending it: it is not started.
    One call's cost is the run's average so far; before any call there is none, and any share will do."""
    account = RunAccount()
    budget = TokenBudget(BUDGET, account)
    assert budget.one_call() == 0 and budget.affords(10)
    account.add_worker(Usage(input_tokens=600, output_tokens=100, model_calls=4))  # 175 tokens a call
    assert budget.one_call() == 175 and budget.left() == 300
    assert budget.affords(1) and not budget.affords(2)  # 300 pays for one call; 150 does not
    assert TokenBudget(0, account).affords(100)  # no budget: nothing to run short of


def test_the_reserve_is_held_back_from_research_until_released() -> None:
    """A verified run's research stops where only the reserve is left; the review then spends it."""
    budget = TokenBudget(BUDGET, account_at(600), reserve=400)
    assert budget.left() == 0
    assert budget.spent()  # research: no next turn, no new delegation
    budget.release_reserve()
    assert budget.left() == 400
    assert not budget.spent()
    assert budget.share(4) == 100  # the review's roles share what was held back
