"""The run's delegation desk: one place that orders work from workers and says what came back.

It builds each order (budgets included), bounds how many delegations run at
once, gives each an equal share of the token budget left, publishes the
delegation's status events, and renders the result the supervisor's context
keeps: the outcome and the entries it promoted, as the scratchpad holds them,
never the worker's transcript.

Budget shares are fair by construction: the agent loop announces every call of
a turn (`announce`) before any of them runs, so the first delegation of a turn
already knows how many share the budget with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry import trace
from pydantic import ValidationError

from quarry.agent.messages import ToolCall
from quarry.agent.scratchpad_tools import render_entries
from quarry.agent.tools import MAX_CALLS_PER_TURN, ToolError
from quarry.identity import Role
from quarry.research_plane import ResearchPlane
from quarry.telemetry import meter, tracer
from quarry.vocabulary import DelegationErrorCode, DelegationResult, Entry, Tier
from supervisor_svc.runs.budget import RunAccount, TokenBudget
from supervisor_svc.runs.domain import REVIEW_ROLES, DelegationOrder, ResearchPhase, RunUsage
from supervisor_svc.runs.ledger import RunLedger
from supervisor_svc.runs.tools import DELEGATE_TOOL, DelegateParams
from supervisor_svc.runs.worker_client import DelegationClient

log = logging.getLogger(__name__)

# Promoted entries shown with a delegation's result, at most (the rest stay one read_scratchpad away).
MAX_PROMOTED_CHARS = 8000
# The supervisor waits this much longer than the worker's own time limit before giving up on it.
_DEADLINE_GRACE_SECONDS = 5.0

# How a delegation ends when its role's model gave no output its contract accepts, after the repair turn.
_CONTRACT_FAILURES = frozenset({DelegationErrorCode.OUTPUT_INVALID, DelegationErrorCode.OUTPUT_REFUSED})

_DELEGATIONS = meter.create_counter("quarry.delegations", description="delegations ended, by outcome")


def render_result(result: DelegationResult, promoted_entries: Sequence[Entry] = ()) -> str:
    """What the supervisor's context keeps of a delegation."""
    promoted = ", ".join(str(n) for n in result.promoted) or "none"
    if result.error_code is None:
        text = (
            f"delegation {result.delegation_id} succeeded in {result.turns} turns; scratchpad entries "
            f"promoted: {promoted}.\nWorker summary: {result.summary}"
        )
    else:
        text = (
            f"error: delegation {result.delegation_id} failed ({result.error_code.name}): {result.error_message}. "
            f"Scratchpad entries promoted before it failed: {promoted}."
        )
    if promoted_entries:
        entries = render_entries(promoted_entries)
        if len(entries) > MAX_PROMOTED_CHARS:
            entries = entries[:MAX_PROMOTED_CHARS] + "\n… (more with read_scratchpad)"
        text += f"\nPromoted entries, from the scratchpad:\n{entries}"
    return text


@dataclass(frozen=True)
class Contract:
    """What a delegation asks of one role: all a blind role ever sees of the run."""

    role: Role
    objective: str
    criteria: tuple[str, ...] = ()
    input_refs: tuple[str, ...] = ()
    workspace_id: str = ""  # an engineer's: the monitor workspace it edits
    max_turns: int = 0  # 0: the desk's
    timeout_seconds: float = 0.0  # 0: until the desk's deadline (which bounds it either way)


class DelegationEvents(Protocol):
    """Where the desk tells how its delegations go (a run's publisher; a campaign tells nobody)."""

    async def status(
        self, phase: ResearchPhase, message: str, *, delegation_id: str = "", worker_id: str = ""
    ) -> None: ...

    async def delegation_ended(self, result: DelegationResult, usage: RunUsage) -> None: ...


@dataclass(frozen=True)
class EarlierOrders:
    """What a desk going on with a run another process began starts from."""

    reuse: Mapping[str, str] = field(default_factory=dict)  # the delegation id to order each key under again
    counted: Collection[str] = ()  # the delegations whose usage the run's account already holds
    ordered: int = 0  # how many delegations the run had ordered


class Delegator:
    def __init__(
        self,
        *,
        run_id: str,
        thread_id: str,
        max_worker_turns: int,
        parallel: int,
        deadline: float,  # time.monotonic() by which the run must end
        client: DelegationClient,
        scratchpad: ResearchPlane,
        account: RunAccount,
        budget: TokenBudget,
        publisher: DelegationEvents,
        ledger: RunLedger,
        earlier: EarlierOrders | None = None,
        tiers: Mapping[Role, Tier] | None = None,
    ) -> None:
        """`earlier`: the delegations a run another process began had ordered (supervisor_svc.runs.resumption)."""
        self._run_id = run_id
        self._thread_id = thread_id
        self._worker_max_turns = max_worker_turns
        self._parallel = parallel
        self._slots = asyncio.Semaphore(parallel)
        self._deadline = deadline
        self._client = client
        self._scratchpad = scratchpad
        self._account = account
        self._budget = budget
        self._publisher = publisher
        self._ledger = ledger
        self._tiers = dict(tiers or {})  # the tier the run routes each named role to
        earlier = earlier or EarlierOrders()
        self._ordered = earlier.ordered
        self._reuse = dict(earlier.reuse)
        self._counted = frozenset(earlier.counted)
        self.dispatched = 0  # delegations that went out to a worker (not those the budget refused)
        self._role_results = 0  # evidence roles' delegations that ended
        self._role_contract_failures = 0  # ...without a valid output: the model did not follow the contract
        self._expected: set[str] = set()  # this turn's delegate calls that will run and have not ended
        self._announced = 0  # this turn's calls, of any tool

    def new_turn(self) -> None:
        self._expected.clear()
        self._announced = 0

    def announce(self, call: ToolCall) -> None:
        """A call of this turn, told before any call of the turn runs. Only delegations that will run share
        the budget: not one the registry refuses (arguments that do not validate, past the per-turn limit)."""
        self._announced += 1
        if call.name != DELEGATE_TOOL or self._announced > MAX_CALLS_PER_TURN:
            return
        try:
            DelegateParams.model_validate_json(call.arguments or "{}")
        except ValidationError:
            return
        self._expected.add(call.id)

    async def delegate(self, params: DelegateParams, call: ToolCall) -> str:
        """The model's delegate_research call: a researcher's task, its result as the model reads it."""
        self._refuse_if_budget_spent()
        try:
            # The model delegates research, screening and extraction only: the roles that judge its work do so
            # blind, so it never directs them.
            role = Role(params.role)
            contract = Contract(role, params.objective, tuple(params.criteria), tuple(params.input_refs))
            result = await self._dispatch(contract, call.id, sharing=lambda: len(self._expected))
        finally:
            self._expected.discard(call.id)
        if result is None:
            raise ToolError(
                "the run's token budget is spent (or what is left would not pay one model call each): "
                "no new delegation starts"
            )
        return render_result(result, await self._promoted_entries(result))

    async def assign(self, contract: Contract, key: str, *, sharing: int = 1) -> DelegationResult | None:
        """A contract the run itself orders (a claim-verifier's, an auditor's, an adjudicator's): its
        result, or None when the token budget was spent before it could start, or its share of what is
        left would not pay for one model call. `key` names the task
        within the run (it becomes the delegation's tool_call_id); `sharing` is how many such tasks
        share the budget left."""
        return await self._dispatch(contract, key, sharing=lambda: sharing)

    def roles_cannot_follow_contracts(self) -> bool:
        """Whether the model failed the evidence roles' contracts repeatedly: at least two of their delegations,
        and at least half, ended without a valid output. A model that cannot play the roles at all."""
        failed = self._role_contract_failures
        return failed >= 2 and 2 * failed >= self._role_results

    def _refuse_if_budget_spent(self) -> None:
        if self._budget.spent():
            raise ToolError("the run's token budget is spent: no new delegation starts")

    async def _dispatch(self, contract: Contract, key: str, *, sharing: Callable[[], int]) -> DelegationResult | None:
        if self._budget.spent():
            return None
        reused = self._reuse.pop(key[:40], None)
        if reused is None:
            self._ordered += 1
        delegation_id = reused or f"{self._run_id}.{self._ordered}.{key[:40]}"
        attributes = {
            "quarry.delegation_id": delegation_id,
            "quarry.run_id": self._run_id,
            "quarry.role": contract.role.value,
        }
        with tracer.start_as_current_span("delegate", attributes=attributes) as span:
            async with self._slots:
                if self._budget.spent():
                    return None
                ways = min(max(sharing(), 1), self._parallel)
                if not self._budget.affords(ways):
                    log.info(
                        "run %s: %s not started: its share of the budget left is under one model call's cost",
                        self._run_id,
                        delegation_id,
                    )
                    return None
                self.dispatched += 1
                order = self._order(contract, key, delegation_id, ways, resumed=reused is not None)
                await self._ledger.assigned(
                    delegation_id, contract.role, contract.objective, contract.criteria, contract.input_refs
                )
                result = await self._run(order)
                await self._ledger.used(result)
            span.set_attribute("quarry.delegation.outcome", result.outcome_label)
            if not result.succeeded:
                span.set_status(trace.Status(trace.StatusCode.ERROR, result.error_message[:200]))
        _DELEGATIONS.add(1, {"quarry.delegation.outcome": result.outcome_label})
        if contract.role in REVIEW_ROLES:
            self._role_results += 1
            self._role_contract_failures += result.error_code in _CONTRACT_FAILURES
        if delegation_id not in self._counted:  # else its usage came with the run from the ledger
            self._account.add_worker(result.usage, verification=contract.role in REVIEW_ROLES)
        await self._publisher.delegation_ended(result, self._account.usage())
        return result

    def _order(self, contract: Contract, key: str, delegation_id: str, ways: int, *, resumed: bool) -> DelegationOrder:
        left = self._deadline - time.monotonic()
        return DelegationOrder(
            delegation_id=delegation_id,
            run_id=self._run_id,
            tool_call_id=key,
            scratchpad_thread_id=self._thread_id,
            objective=contract.objective,
            criteria=contract.criteria,
            input_refs=contract.input_refs,
            role=contract.role,
            max_turns=contract.max_turns or self._worker_max_turns,
            max_tokens=self._budget.share(ways),
            timeout_seconds=min(left, contract.timeout_seconds) if contract.timeout_seconds else left,
            workspace_id=contract.workspace_id,
            tier=self._tiers.get(contract.role),
            resumed=resumed,
        )

    async def _run(self, order: DelegationOrder) -> DelegationResult:
        # The "delegated" event is written while the call goes out (it is not on the hop to the worker);
        # the delegation's later events wait for it, so the order on the wire stays the order of events.
        announced = asyncio.ensure_future(
            self._publisher.status(
                ResearchPhase.WORKER_DELEGATED, order.objective[:200], delegation_id=order.delegation_id
            )
        )

        async def turn_started(turn: int, max_turns: int, worker_id: str) -> None:
            await announced
            await self._publisher.status(
                ResearchPhase.WORKER_RESEARCHING,
                f"turn {turn} of {max_turns}",
                delegation_id=order.delegation_id,
                worker_id=worker_id,
            )

        try:
            return await self._client.run(
                order,
                deadline_seconds=max(order.timeout_seconds, 1.0) + _DEADLINE_GRACE_SECONDS,
                on_turn=turn_started,
                on_started=lambda worker_id, tier, model: self._ledger.routed(
                    order.delegation_id, worker_id, tier, model
                ),
            )
        finally:
            await announced

    async def _promoted_entries(self, result: DelegationResult) -> list[Entry]:
        """Re-read what the delegation promoted: the supervisor sees findings as the scratchpad holds them."""
        numbers = set(result.promoted)
        if not numbers:
            return []
        try:
            entries = await self._scratchpad.read_all(self._thread_id, after_sequence_no=min(numbers) - 1)
        except Exception as error:  # the result stands without them; read_scratchpad can fetch them later
            log.warning("run %s: could not re-read promoted entries: %s", self._run_id, error)
            return []
        return [entry for entry in entries if entry.sequence_no in numbers]
