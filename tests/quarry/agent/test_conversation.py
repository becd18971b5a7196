"""Conversation history comes back in persistence order, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from quarry.agent.conversation import ConversationStore, metadata
from quarry.agent.messages import ToolCall, assistant, system, tool_result, user
from quarry.db import Database
from quarry.errors import NotFound


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[ConversationStore]:
    database = Database(database_url)
    metadata.create_all(database.engine)
    yield ConversationStore(database)
    await database.close()


async def test_history_is_rebuilt_in_sequence_order(store: ConversationStore) -> None:
    await store.create("conv-1")
    calls = (ToolCall("a", "read_scratchpad", "{}"), ToolCall("b", "perform_web_search", '{"query": "q"}'))
    written = [
        system("rules"),
        user("task"),
        assistant("", calls),
        # Results written in one batch, in the same instant: order must still be exact.
        tool_result("b", "results"),
        tool_result("a", "seed"),
        assistant("done"),
    ]
    numbers = [
        *await store.append("conv-1", written[:2]),
        *await store.append("conv-1", written[2:3]),
        *await store.append("conv-1", written[3:5]),
        *await store.append("conv-1", written[5:]),
    ]
    assert numbers == [1, 2, 3, 4, 5, 6]
    assert await store.history("conv-1") == written


async def test_concurrent_appends_stay_gap_free_and_whole(store: ConversationStore) -> None:
    await store.create("conv-2")
    batches = [[user(f"{i}-a"), user(f"{i}-b")] for i in range(10)]
    results = await asyncio.gather(*(store.append("conv-2", batch) for batch in batches))
    assert sorted(n for numbers in results for n in numbers) == list(range(1, 21))
    history = await store.history("conv-2")
    for numbers, batch in zip(results, batches, strict=True):
        assert numbers[1] == numbers[0] + 1, "a batch is contiguous"
        assert [history[n - 1] for n in numbers] == batch


async def test_conversations_are_separate_and_unknown_ones_refused(store: ConversationStore) -> None:
    await store.create("conv-3")
    await store.create("conv-4")
    await store.append("conv-3", [user("three")])
    assert await store.history("conv-4") == []
    with pytest.raises(NotFound):
        await store.append("missing", [user("x")])


async def test_a_conversation_created_with_its_opening_continues_after_it(store: ConversationStore) -> None:
    await store.create("conv-open", [system("rules"), user("task")])
    assert await store.append("conv-open", [assistant("first reply")]) == [3]
    assert [m.content for m in await store.history("conv-open")] == ["rules", "task", "first reply"]


async def test_nul_from_a_page_or_a_model_is_stored_not_fatal(store: ConversationStore) -> None:
    await store.create("conv-nul")
    call = ToolCall("c\x00", "read_web_page", '{"url": "http://x/\\u0000"}\x00')
    await store.append("conv-nul", [assistant("before\x00after", (call,)), tool_result("c\x00", "page\x00text")])
    [reply, result] = await store.history("conv-nul")
    assert reply.content == "before\ufffdafter" and result.content == "page\ufffdtext"
    assert reply.tool_calls[0].id == result.tool_call_id == "c\ufffd"
