"""Every tool call gets exactly one result, in call order, whatever the tool does."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel, Field

from quarry.agent.messages import ToolCall
from quarry.agent.tools import MAX_CALLS_PER_TURN, Tool, ToolError, ToolRegistry


class Query(BaseModel):
    query: str = Field(min_length=1, description="what to look for")
    limit: int = Field(default=5, ge=1, le=20)


class Empty(BaseModel):
    pass


async def search(params: Query, context: list[str]) -> str:
    await asyncio.sleep(0.01 * params.limit)  # later calls may finish first
    context.append(params.query)
    return f"results for {params.query}"


async def refuse(params: Empty, context: list[str]) -> str:
    raise ToolError("the page was not read in this delegation")


async def crash(params: Empty, context: list[str]) -> str:
    raise RuntimeError("boom")


CATALOG = [
    Tool("perform_web_search", "search the web", Query, search),
    Tool("read_web_page", "read a page", Empty, refuse),
    Tool("scroll_web_page", "scroll", Empty, crash),
    Tool("read_scratchpad", "read shared state", Empty, refuse),
]
CAPABILITIES = {
    "web_search": ["perform_web_search", "read_web_page", "scroll_web_page"],
    "scratchpad": ["read_scratchpad"],
}


def test_capabilities_expand_to_the_role_s_tools_only() -> None:
    registry = ToolRegistry.for_capabilities(CATALOG, CAPABILITIES, ["scratchpad"])
    assert registry.names == ["read_scratchpad"]
    both = ToolRegistry.for_capabilities(CATALOG, CAPABILITIES, ["web_search", "scratchpad"])
    assert both.names == ["perform_web_search", "read_web_page", "scroll_web_page", "read_scratchpad"]
    with pytest.raises(ValueError, match="unknown capabilities"):
        ToolRegistry.for_capabilities(CATALOG, CAPABILITIES, ["compute"])


def test_schemas_are_openai_function_tools() -> None:
    schema = ToolRegistry(CATALOG[:1]).schemas()[0]
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "perform_web_search"
    assert schema["function"]["parameters"]["required"] == ["query"]


async def test_an_unlisted_tool_answers_calls_without_being_offered() -> None:
    registry = ToolRegistry(CATALOG[:1], unlisted=CATALOG[1:2])
    assert registry.names == ["perform_web_search"]
    assert [schema["function"]["name"] for schema in registry.schemas()] == ["perform_web_search"]
    [outcome] = await registry.run_calls([ToolCall("c1", "read_web_page", "{}")], [])
    assert outcome.content == "error: the page was not read in this delegation", "its own answer, not 'no such tool'"
    # A tool it does not have is named with the tools it was offered, never the unlisted ones.
    [unknown] = await registry.run_calls([ToolCall("c2", "delete_everything", "{}")], [])
    assert unknown.is_error and unknown.content.endswith("available: perform_web_search")
    with pytest.raises(ValueError, match="two tools"):
        ToolRegistry(CATALOG[:1], unlisted=CATALOG[:1])


async def test_parallel_calls_each_get_one_result_in_call_order() -> None:
    registry = ToolRegistry.for_capabilities(CATALOG, CAPABILITIES, ["web_search"])
    calls = [
        ToolCall("c1", "perform_web_search", '{"query": "slow", "limit": 9}'),
        ToolCall("c2", "perform_web_search", '{"query": "fast", "limit": 1}'),
        ToolCall("c3", "read_web_page", "{}"),
        ToolCall("c4", "scroll_web_page", "{}"),
        ToolCall("c5", "no_such_tool", "{}"),
        ToolCall("c6", "perform_web_search", '{"query": ""}'),
        ToolCall("c7", "perform_web_search", "not json"),
    ]
    seen: list[str] = []
    outcomes = await registry.run_calls(calls, seen)
    assert [o.call.id for o in outcomes] == [c.id for c in calls]
    assert [m.tool_call_id for m in (o.message() for o in outcomes)] == [c.id for c in calls]
    assert seen == ["fast", "slow"], "the calls ran concurrently"
    assert [o.is_error for o in outcomes] == [False, False, True, True, True, True, True]
    assert outcomes[0].content == "results for slow"
    assert "not read in this delegation" in outcomes[2].content
    assert "failed unexpectedly" in outcomes[3].content and "boom" not in outcomes[3].content
    assert "no tool named 'no_such_tool'" in outcomes[4].content
    assert "query" in outcomes[5].content
    assert "invalid arguments" in outcomes[6].content


async def test_cancellation_is_not_turned_into_a_result() -> None:
    async def hang(params: Empty, context: list[str]) -> str:
        await asyncio.Event().wait()
        return "never"

    registry = ToolRegistry([Tool("hang", "waits forever", Empty, hang)])
    task = asyncio.create_task(registry.run_calls([ToolCall("c1", "hang", "{}")], []))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_calls_beyond_the_per_turn_cap_are_answered_with_errors() -> None:
    registry = ToolRegistry.for_capabilities(CATALOG, CAPABILITIES, ["web_search"])
    calls = [
        ToolCall(f"c{i}", "perform_web_search", '{"query": "q", "limit": 1}') for i in range(MAX_CALLS_PER_TURN + 4)
    ]
    seen: list[str] = []
    outcomes = await registry.run_calls(calls, seen)
    assert [o.call.id for o in outcomes] == [c.id for c in calls]
    assert len(seen) == MAX_CALLS_PER_TURN
    assert all(o.is_error and "at most" in o.content for o in outcomes[MAX_CALLS_PER_TURN:])


async def test_a_stray_cancelled_error_from_a_tool_is_a_tool_failure() -> None:
    async def closed_channel(params: Empty, context: list[str]) -> str:
        raise asyncio.CancelledError  # what grpc.aio does on a closed channel, without any cancellation

    registry = ToolRegistry([Tool("rpc", "calls a service", Empty, closed_channel)])
    (outcome,) = await registry.run_calls([ToolCall("c1", "rpc", "{}")], [])
    assert outcome.is_error and "interrupted" in outcome.content
