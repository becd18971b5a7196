"""One batch append at the store, on SQLite and PostgreSQL: new and used request ids mixed in one transaction.

The gRPC tests reach the same code only when concurrent appends happen to share a batch; here each batch
is built by hand, so both paths run on both databases every time: the fast path (every request id new)
and the careful one (some already used), which numbers only the new entries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from quarry.errors import AlreadyExists, QuarryError
from quarry.identity import Role
from quarry.migrations import open_migrated_database
from quarry.vocabulary import EntryKind
from scratchpad_svc.service import MIGRATIONS, VERSION_TABLE
from scratchpad_svc.store import BatchOutcome, ScratchpadStore
from scratchpad_svc.threads import AppendCommand, AppendResult, NewThread

THREAD = "thread-batches"


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[ScratchpadStore]:
    database = await open_migrated_database(database_url, MIGRATIONS, VERSION_TABLE)
    store = ScratchpadStore(database)
    await store.create_thread(NewThread(thread_id=THREAD, title="batches"))
    yield store
    await database.close()


def command(request_id: str, content: str = "") -> AppendCommand:
    return AppendCommand(
        THREAD, request_id, EntryKind.FINDING, "worker-a", Role.RESEARCHER, content or f"fact {request_id}"
    )


async def append(store: ScratchpadStore, *request_ids: str) -> BatchOutcome:
    return await store.append_batch(THREAD, [command(request_id) for request_id in request_ids])


def appended(results: Sequence[AppendResult | QuarryError]) -> list[AppendResult]:
    assert all(isinstance(result, AppendResult) for result in results), results
    return [result for result in results if isinstance(result, AppendResult)]


async def stored_numbers(store: ScratchpadStore) -> tuple[list[tuple[int, str]], int]:
    entries, last = await store.read(THREAD, 0, 100)
    return [(entry.sequence_no, entry.request_id) for entry in entries], last


async def test_a_batch_mixing_new_and_used_request_ids_numbers_only_the_new_ones_without_gaps(
    store: ScratchpadStore,
) -> None:
    await append(store, "old")
    outcome = await append(store, "a", "old", "b", "a", "c", "old")
    results = appended(outcome.results)
    assert [(r.entry.request_id, r.entry.sequence_no, r.replayed) for r in results] == [
        ("a", 2, False),
        ("old", 1, True),
        ("b", 3, False),
        ("a", 2, True),
        ("c", 4, False),
        ("old", 1, True),
    ]
    assert outcome.last_sequence_no == 4
    # The counter advanced by the new entries only: the next append follows at once.
    assert [r.entry.sequence_no for r in appended((await append(store, "d")).results)] == [5]
    assert await stored_numbers(store) == ([(1, "old"), (2, "a"), (3, "b"), (4, "c"), (5, "d")], 5)
    assert (await store.get_thread(THREAD)).last_sequence_no == 5


async def test_replaying_a_mixed_batch_changes_nothing(store: ScratchpadStore) -> None:
    await append(store, "old")
    first = appended((await append(store, "a", "old", "b")).results)
    again = await append(store, "a", "old", "b")
    assert [r.entry for r in appended(again.results)] == [r.entry for r in first]
    assert all(r.replayed for r in appended(again.results))
    assert again.last_sequence_no == 3
    assert await stored_numbers(store) == ([(1, "old"), (2, "a"), (3, "b")], 3)


async def test_a_reused_request_id_in_a_mixed_batch_fails_alone_and_leaves_no_gap(store: ScratchpadStore) -> None:
    await append(store, "old")
    outcome = await store.append_batch(THREAD, [command("e"), command("old", "another fact"), command("f")])
    created, refused, later = outcome.results
    assert isinstance(refused, AlreadyExists) and "sequence_no 1" in str(refused)
    assert isinstance(created, AppendResult) and isinstance(later, AppendResult)
    assert (created.entry.sequence_no, later.entry.sequence_no) == (2, 3)
    assert await stored_numbers(store) == ([(1, "old"), (2, "e"), (3, "f")], 3)


async def test_a_new_batch_that_repeats_a_request_id_reserves_one_number_for_it(store: ScratchpadStore) -> None:
    outcome = await append(store, "x", "x", "y", "x")
    assert [(r.entry.sequence_no, r.replayed) for r in appended(outcome.results)] == [
        (1, False),
        (1, True),
        (2, False),
        (1, True),
    ]
    assert outcome.last_sequence_no == 2
    assert [r.entry.sequence_no for r in appended((await append(store, "z")).results)] == [3]
    assert await stored_numbers(store) == ([(1, "x"), (2, "y"), (3, "z")], 3)
