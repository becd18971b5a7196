"""The SQL the host's tenants share, on the runs' tables (the campaigns' run the same code): leases, the start
by request id, the event log's reads. Each test runs on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from quarry.db import Database, open_migrated_database
from quarry.errors import AlreadyExists, ErrorReason
from supervisor_svc.hosting.store import RELEASED
from supervisor_svc.runs.domain import ResearchPhase, RunErrorCode, RunOutcome, RunUsage, StartRequest
from supervisor_svc.runs.events import status
from supervisor_svc.runs.store import RunStore
from supervisor_svc.service import MIGRATIONS, VERSION_TABLE

MINE, THEIRS = "run-" + "a" * 32, "run-" + "b" * 32


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[RunStore]:
    database: Database = await open_migrated_database(database_url, MIGRATIONS, VERSION_TABLE)
    yield RunStore(database)
    await database.close()


async def test_leases_are_renewed_held_expired_and_released_only_for_live_work_of_their_owner(
    store: RunStore,
) -> None:
    for run_id, owner in ((MINE, "me"), (THEIRS, "them")):
        await store.create(run_id, StartRequest(f"Question of {owner}?"), scratchpad_thread_id=run_id, owner=owner)
    later = datetime.now(UTC) + timedelta(minutes=5)
    await store.renew("me", [MINE, THEIRS], later)
    assert await store.held("me", [MINE, THEIRS]) == {MINE}
    assert await store.expired(later) == [THEIRS]  # renewed before `later`: only theirs
    await store.release("me", [MINE])
    assert sorted(await store.expired(RELEASED + timedelta(seconds=1))) == [MINE]
    await store.finish(MINE, RunOutcome.failed(RunErrorCode.INTERNAL, "ended", RunUsage()))
    assert await store.held("me", [MINE]) == set()
    assert await store.expired(later + timedelta(minutes=1)) == [THEIRS]  # an ended run holds no lease


async def test_a_request_id_gives_back_its_work_and_refuses_another_ask(store: RunStore) -> None:
    asked = StartRequest("Why?", request_id="req-1")
    first, created = await store.create(MINE, asked, scratchpad_thread_id=MINE, owner="me")
    again, created_again = await store.create(THEIRS, asked, scratchpad_thread_id=THEIRS, owner="me")
    assert created and not created_again and again == first
    with pytest.raises(AlreadyExists) as reused:
        await store.by_request_id("req-1", StartRequest("Why not?", request_id="req-1"))
    assert reused.value.reason is ErrorReason.REQUEST_ID_REUSED
    assert reused.value.metadata == {"run_id": MINE}
    assert await store.by_request_id("req-2", asked) is None


async def test_the_event_log_is_read_in_order_after_a_sequence_number(store: RunStore) -> None:
    await store.create(MINE, StartRequest("Why?"), scratchpad_thread_id=MINE, owner="me")
    await store.append(MINE, [status(ResearchPhase.PLANNING, f"step {n}") for n in range(3)])
    await store.finish(MINE, RunOutcome.failed(RunErrorCode.INTERNAL, "ended", RunUsage()))
    events = await store.events_after(MINE, 1)
    assert [(e.sequence_no, e.terminal) for e in events] == [(2, False), (3, False), (4, True)]
    assert [e.sequence_no for e in await store.events_after(MINE, 0, limit=2)] == [1, 2]
