"""What a run has consumed, by tier, and what its token budget still allows.

The budget is a pure predicate over the usage so far: asking it changes
nothing. The callers decide what a spent budget means (no new delegation; no
next supervisor turn).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quarry.agent.usage import Usage
from supervisor_svc.runs.domain import RunUsage


class RunAccount:
    """The run's usage: the supervisor's planning loop, its report call, and every worker's."""

    def __init__(self) -> None:
        self._planning: Callable[[], Usage] = Usage
        self._carried = Usage()  # the supervisor's own usage before this process took the run up
        self.report = Usage()
        self.workers = Usage()
        self.verification = Usage()  # the part of `workers` that claim-verifiers, auditors and adjudicators spent

    def carry(self, supervisor: Usage, workers: Usage, verification: Usage) -> None:
        """What the run had spent when this process took it up (as the process that began it recorded it):
        counted before everything spent here."""
        self._carried = supervisor
        self.workers += workers
        self.verification += verification

    def count_planning(self, source: Callable[[], Usage]) -> None:
        """Planning usage is read live from the agent loop that spends it."""
        self._planning = source

    def add_worker(self, usage: Usage, *, verification: bool = False) -> None:
        self.workers += usage
        if verification:
            self.verification += usage

    def usage(self) -> RunUsage:
        supervisor = self._carried + self._planning() + self.report
        return RunUsage(supervisor=supervisor, workers=self.workers, verification=self.verification)


@dataclass
class TokenBudget:
    max_tokens: int  # 0: unbounded
    account: RunAccount
    # Tokens held back from the research phase for the report and its review (claim verifiers, the draft,
    # the citation audit, revisions and adjudication): the research cannot spend them, so a tight budget
    # never leaves the review without the means to finish. Released when research ends.
    reserve: int = 0

    def left(self) -> int | None:
        """Tokens left (less what is still reserved), or None when the run has no token budget."""
        if not self.max_tokens:
            return None
        return self.max_tokens - self.reserve - self.account.usage().total.tokens

    def release_reserve(self) -> None:
        """Research is over: what was held back for the review is now the review's to spend."""
        self.reserve = 0

    def spent(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def share(self, ways: int) -> int:
        """An equal part of what is left for each of `ways` delegations (0: no bound)."""
        left = self.left()
        return 0 if left is None else max(left // max(ways, 1), 1)

    def one_call(self) -> int:
        """What one model call has cost this run, on average (0 before any call)."""
        total = self.account.usage().total
        return total.tokens // total.model_calls if total.model_calls else 0

    def affords(self, ways: int) -> bool:
        """Whether each of `ways` delegations would get at least one model call's cost: a share smaller than
        that buys a call that is cut off, so the delegation is not started (its work is left undone, and
        says so) rather than started to fail on the budget."""
        share = self.share(ways)
        return share == 0 or share >= self.one_call()
