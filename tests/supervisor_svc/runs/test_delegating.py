"""The delegation desk: budget shares are fair from the first delegation of a turn, by construction."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from quarry.agent.messages import ToolCall
from quarry.agent.tools import ToolError
from quarry.agent.usage import Usage
from quarry.db import Database
from quarry.identity import Principal, Role
from quarry.migrations import upgrade_schema_async
from quarry.notify import CommitSignal
from quarry.records.research import Assignment, ResearchRecord, RouteDecision, TaskKind, UsageObserved, parse_record
from quarry.research_plane import Appended
from quarry.vocabulary import DelegationResult, Entry, EntryKind, Tier
from supervisor_svc.runs.budget import RunAccount, TokenBudget
from supervisor_svc.runs.delegating import Contract, Delegator
from supervisor_svc.runs.domain import DelegationOrder, StartRequest
from supervisor_svc.runs.ledger import RunLedger
from supervisor_svc.runs.publishing import RunEventLog, RunPublisher
from supervisor_svc.runs.store import RunStore
from supervisor_svc.runs.tools import DelegateParams
from supervisor_svc.runs.worker_client import StartListener
from supervisor_svc.service import MIGRATIONS, VERSION_TABLE

RUN_ID = "run-" + "b" * 32


class RecordingWorkers:
    """Stands in for the worker pool: records each order and ends it when the test says so."""

    def __init__(self) -> None:
        self.orders: list[DelegationOrder] = []
        self.release: dict[str, asyncio.Event] = {}
        self.arrived = asyncio.Condition()

    async def run(
        self, order: DelegationOrder, *, deadline_seconds: float, on_turn: object, on_started: StartListener
    ) -> DelegationResult:
        gate = self.release.setdefault(order.tool_call_id, asyncio.Event())
        async with self.arrived:
            self.orders.append(order)
            self.arrived.notify_all()
        await on_started("worker-7", Tier.WORKER, "scripted")
        await gate.wait()
        return DelegationResult(order.delegation_id, usage=Usage(100, 100, 1, 0))

    async def wait_for(self, count: int) -> None:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.orders) >= count), 10)


class RecordingPlane:
    """Stands in for the scratchpad: keeps what the ledger appends, in order."""

    def __init__(self) -> None:
        self.appended: list[tuple[EntryKind, ResearchRecord, str]] = []

    async def append(
        self, thread_id: str, *, kind: EntryKind, author: Principal, content: str, request_id: str, **_: object
    ) -> Appended:
        self.appended.append((kind, parse_record(kind, content), request_id))
        entry = Entry(thread_id, len(self.appended), kind, author, content, (), datetime.now(UTC))
        return Appended(entry, replayed=False)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RunStore]:
    url = f"sqlite:///{tmp_path / 'supervisor.db'}"
    await upgrade_schema_async(url, MIGRATIONS, VERSION_TABLE)
    database = Database(url)
    store = RunStore(database)
    await store.create(RUN_ID, StartRequest("Shares?"), scratchpad_thread_id=RUN_ID, owner="test")
    yield store
    await database.close()


def desk(
    store: RunStore, *, parallel: int, max_tokens: int, plane: RecordingPlane | None = None
) -> tuple[Delegator, RecordingWorkers, RunAccount]:
    """A delegation desk for one run in `store`, ordering work from recording workers."""
    workers = RecordingWorkers()
    account = RunAccount()
    publisher = RunPublisher(RunEventLog(store, CommitSignal(), RUN_ID), None, RUN_ID, RUN_ID)  # type: ignore[arg-type]
    delegator = Delegator(
        run_id=RUN_ID,
        thread_id=RUN_ID,
        max_worker_turns=0,
        parallel=parallel,
        deadline=time.monotonic() + 60,
        client=workers,  # type: ignore[arg-type]
        scratchpad=None,  # type: ignore[arg-type]
        account=account,
        budget=TokenBudget(max_tokens, account),
        publisher=publisher,
        ledger=RunLedger(plane or RecordingPlane(), RUN_ID, RUN_ID),  # type: ignore[arg-type]
    )
    return delegator, workers, account


async def test_parallel_delegations_share_the_budget_left_from_the_first_one(store: RunStore) -> None:
    delegator, workers, account = desk(store, parallel=2, max_tokens=1200)
    calls = [ToolCall(id=f"c{n}", name="delegate_research", arguments='{"objective": "x"}') for n in range(3)]
    delegator.new_turn()
    for call in calls:  # the loop announces a turn's calls before any of them runs
        delegator.announce(call)
    tasks = [asyncio.create_task(delegator.delegate(DelegateParams(objective="x"), call)) for call in calls]
    await workers.wait_for(2)
    # Three calls, two slots: the two running ones split what is left, the first as much as the second.
    assert [order.max_tokens for order in workers.orders] == [600, 600]
    workers.release["c0"].set()
    await workers.wait_for(3)
    # c0 spent 200: 1000 left, shared by the one still running and the one starting.
    assert workers.orders[2].max_tokens == 500
    for call in calls[1:]:
        workers.release[call.id].set()
    results = await asyncio.gather(*tasks)
    assert all("succeeded" in text for text in results)
    assert account.usage().workers.tokens == 600


async def test_every_delegation_is_assigned_routed_and_its_usage_observed_in_the_ledger_in_that_order(
    store: RunStore,
) -> None:
    plane = RecordingPlane()
    delegator, workers, account = desk(store, parallel=2, max_tokens=0, plane=plane)
    contract = Contract(Role.VERIFIER, "Verify finding 3", ("quote exactly",), ("3", "https://a.example/p"))
    workers.release["verify-3"] = asyncio.Event()
    workers.release["verify-3"].set()
    result = await delegator.assign(contract, "verify-3")
    assert result is not None and result.succeeded
    records = [record for _, record, _ in plane.appended]
    assert [type(record) for record in records] == [Assignment, RouteDecision, UsageObserved]
    assert records[0] == Assignment(
        delegation_id=result.delegation_id,
        role=Role.VERIFIER,
        task_kind=TaskKind.CLAIM_VERIFICATION,
        objective="Verify finding 3",
        criteria=("quote exactly",),
        input_refs=("3", "https://a.example/p"),
    )
    assert records[1] == RouteDecision(
        delegation_id=result.delegation_id, worker_id="worker-7", tier=Tier.WORKER, model="scripted"
    )
    assert records[2] == UsageObserved(
        delegation_id=result.delegation_id, input_tokens=100, output_tokens=100, model_calls=1
    )
    assert len({request_id for _, _, request_id in plane.appended}) == 3  # one idempotency key each
    # Evidence roles' usage counts as the run's verification cost, as well as the workers'.
    assert account.usage().verification.tokens == account.usage().workers.tokens == 200


async def test_a_contract_the_ledger_cannot_record_still_runs(store: RunStore) -> None:
    """A blank criterion passes the tool's and the worker's checks but not the Assignment schema: the
    delegation runs, its assignment goes unrecorded (logged), and the rest of the ledger is written."""
    plane = RecordingPlane()
    delegator, workers, _ = desk(store, parallel=1, max_tokens=0, plane=plane)
    workers.release["blank"] = asyncio.Event()
    workers.release["blank"].set()
    result = await delegator.assign(Contract(Role.RESEARCHER, "x", criteria=(" ",)), "blank")
    assert result is not None and result.succeeded
    assert [type(record) for _, record, _ in plane.appended] == [RouteDecision, UsageObserved]


async def test_a_delegate_call_the_registry_will_refuse_takes_no_share(store: RunStore) -> None:
    delegator, workers, _ = desk(store, parallel=4, max_tokens=1000)
    valid = [ToolCall(id=f"ok{n}", name="delegate_research", arguments='{"objective": "x"}') for n in range(2)]
    delegator.new_turn()
    delegator.announce(ToolCall(id="bad", name="delegate_research", arguments="{}"))  # no objective
    delegator.announce(ToolCall(id="read", name="read_scratchpad", arguments="{}"))
    for call in valid:
        delegator.announce(call)
    tasks = [asyncio.create_task(delegator.delegate(DelegateParams(objective="x"), call)) for call in valid]
    await workers.wait_for(2)
    assert [order.max_tokens for order in workers.orders] == [500, 500]
    for call in valid:
        workers.release[call.id].set()
    await asyncio.gather(*tasks)


@pytest.mark.parametrize(("used", "starts"), [(999, True), (1000, False), (1001, False)], ids=["under", "at", "over"])
async def test_a_run_at_its_token_budget_starts_no_delegation(store: RunStore, used: int, starts: bool) -> None:
    """Intended side: usage equal to the budget is spent ("Once reached, no new delegation starts",
    RunOptions.max_tokens); one token under still delegates, with that one token as its share."""
    delegator, workers, account = desk(store, parallel=1, max_tokens=1000)
    account.add_worker(Usage(input_tokens=used))
    workers.release["c1"] = asyncio.Event()
    workers.release["c1"].set()
    call = ToolCall(id="c1", name="delegate_research", arguments='{"objective": "x"}')
    delegator.new_turn()
    delegator.announce(call)
    if starts:
        assert "succeeded" in await delegator.delegate(DelegateParams(objective="x"), call)
        assert [order.max_tokens for order in workers.orders] == [1]
    else:
        with pytest.raises(ToolError, match="token budget is spent"):
            await delegator.delegate(DelegateParams(objective="x"), call)
        assert await delegator.assign(Contract(Role.VERIFIER, "y"), "v1") is None
        assert workers.orders == [] and delegator.dispatched == 0


async def test_a_role_whose_share_would_not_pay_one_call_is_not_started(store: RunStore) -> None:
    delegator, workers, account = desk(store, parallel=4, max_tokens=1000)
    account.add_worker(Usage(input_tokens=700, output_tokens=100, model_calls=4))  # 200 tokens a call, 200 left
    assert await delegator.assign(Contract(Role.CITATION_AUDITOR, "audit"), "a1", sharing=2) is None  # 100 each
    assert workers.orders == [] and delegator.dispatched == 0
    workers.release["a2"] = asyncio.Event()
    workers.release["a2"].set()
    result = await delegator.assign(Contract(Role.CITATION_AUDITOR, "audit"), "a2", sharing=1)  # 200: one call
    assert result is not None and [order.max_tokens for order in workers.orders] == [200]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"objective": "x", "criteria": ["c" * 1001]}, "criteria"),
        ({"objective": "x", "input_refs": ["https://a.b/" + "r" * 2048]}, "input_refs"),
        ({"objective": "x", "criteria": ["c"] * 11}, "criteria"),
        ({"objective": "Find\x00 it"}, "objective"),
        ({"objective": "x", "input_refs": ["a\x00"]}, "input_refs"),
    ],
)
def test_a_delegation_the_worker_would_refuse_is_refused_as_a_tool_error(
    arguments: dict[str, object], field: str
) -> None:
    """The worker bounds criteria and input_refs and refuses NUL; the tool's own parameters say so first."""
    with pytest.raises(ValidationError) as raised:
        DelegateParams.model_validate_json(json.dumps(arguments))
    assert {error["loc"][0] for error in raised.value.errors()} == {field}
    assert DelegateParams(objective="x", criteria=["c" * 1000] * 10, input_refs=["r" * 2048] * 20).criteria
