"""The bounded loop against the scripted model: correlation, budgets, and honest failure."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from quarry.agent.conversation import ConversationStore, metadata
from quarry.agent.loop import (
    AgentRun,
    LoopLimits,
    LoopObserver,
    TokenBudgetExhausted,
    TurnBudgetExhausted,
    unanswered_calls,
)
from quarry.agent.messages import ToolCall, system, user
from quarry.agent.model import ModelClient, ModelSettings, ProviderError
from quarry.agent.tools import Tool, ToolOutcome, ToolRegistry
from quarry.agent.usage import Usage
from quarry.db import Database
from tests.fakes.openai_server import Call, DropAfter, EndWithout, Reply, ScriptedModel


class Query(BaseModel):
    query: str


class Empty(BaseModel):
    pass


async def search(params: Query, context: list[str]) -> str:
    context.append(params.query)
    return f"results for {params.query}"


async def read_scratchpad(params: Empty, context: list[str]) -> str:
    return "seed: find the height of the Eiffel Tower"


TOOLS: ToolRegistry[list[str]] = ToolRegistry(
    [Tool("perform_web_search", "search", Query, search), Tool("read_scratchpad", "read", Empty, read_scratchpad)]
)


class Recorder(LoopObserver):
    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    async def turn_started(self, turn: int, max_turns: int) -> None:
        self.events.append(("turn", turn, max_turns))

    async def tool_called(self, turn: int, call: ToolCall) -> None:
        self.events.append(("call", turn, call.id, call.name))

    async def tool_finished(self, turn: int, outcome: ToolOutcome) -> None:
        self.events.append(("result", turn, outcome.call.id, outcome.is_error))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ConversationStore]:
    database = Database(f"sqlite:///{tmp_path / 'agent.db'}")
    metadata.create_all(database.engine)
    yield ConversationStore(database)
    await database.close()


async def start(
    store: ConversationStore,
    model: ScriptedModel,
    limits: LoopLimits,
    *,
    native: bool = True,
    observer: LoopObserver | None = None,
) -> AgentRun[list[str]]:
    await store.create("conv")
    await store.append("conv", [system("You research."), user("How tall is the Eiffel Tower?")])
    client = ModelClient(ModelSettings(base_url=model.base_url, model="scripted", native_tools=native, retry_budget=5))
    return AgentRun(client, TOOLS, store, "conv", limits, observer)


async def test_parallel_calls_each_get_their_own_result_then_the_answer(
    model: ScriptedModel, store: ConversationStore
) -> None:
    model.script(
        Reply(calls=(Call("read_scratchpad", {}, "c1"), Call("perform_web_search", {"query": "eiffel height"}, "c2"))),
        Reply(content="330 m.", input_tokens=30, output_tokens=3),
    )
    recorder = Recorder()
    run = await start(store, model, LoopLimits(max_turns=4), observer=recorder)
    searched: list[str] = []
    assert await run.run(searched) == "330 m."
    assert searched == ["eiffel height"]
    assert run.turns == 2
    assert run.usage == Usage(input_tokens=40, output_tokens=8, model_calls=2, tool_calls=2)
    second_request = model.requests[1]["messages"]
    tool_messages = [m for m in second_request if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages] == [
        ("c1", "seed: find the height of the Eiffel Tower"),
        ("c2", "results for eiffel height"),
    ]
    history = await store.history("conv")
    assert [m.role for m in history] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert recorder.events == [
        ("turn", 1, 4),
        ("call", 1, "c1", "read_scratchpad"),
        ("call", 1, "c2", "perform_web_search"),
        ("result", 1, "c1", False),
        ("result", 1, "c2", False),
        ("turn", 2, 4),
    ]


async def test_bad_calls_become_error_results_the_model_can_act_on(
    model: ScriptedModel, store: ConversationStore
) -> None:
    model.script(
        Reply(calls=(Call("perform_web_search", "{not json", "c1"), Call("delete_everything", {}, "c2"))),
        Reply(content="Recovered."),
    )
    run = await start(store, model, LoopLimits())
    assert await run.run([]) == "Recovered."
    results = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["c1", "c2"]
    assert "invalid arguments" in results[0]["content"]
    assert "no tool named 'delete_everything'" in results[1]["content"]


async def test_finished_ends_the_run_after_the_turn_whose_tools_delivered_its_output(
    model: ScriptedModel, store: ConversationStore
) -> None:
    model.script(
        Reply(calls=(Call("perform_web_search", {"query": "first"}, "c1"),)),
        Reply(calls=(Call("perform_web_search", {"query": "final"}, "c2"),)),
        Reply(content="never asked for"),
    )
    await store.create("conv")
    client = ModelClient(ModelSettings(base_url=model.base_url, model="scripted"))
    searched: list[str] = []
    asked: list[int] = []

    def finished(turn: int) -> bool:
        asked.append(turn)
        return "final" in searched

    run = AgentRun(client, TOOLS, store, "conv", LoopLimits(), finished=finished)
    assert await run.run(searched, history=[user("go")]) == ""
    assert asked == [1, 2] and len(model.requests) == 2
    # The stored conversation ends with the tool's result: every call answered.
    assert [m.role for m in await store.history("conv")][-2:] == ["assistant", "tool"]


async def test_the_turn_budget_is_a_hard_bound(model: ScriptedModel, store: ConversationStore) -> None:
    model.script(*[Reply(calls=(Call("read_scratchpad", {}, f"c{i}"),)) for i in range(10)])
    run = await start(store, model, LoopLimits(max_turns=3))
    with pytest.raises(TurnBudgetExhausted):
        await run.run([])
    assert len(model.requests) == 3 and run.turns == 3


async def test_the_token_budget_stops_the_run(model: ScriptedModel, store: ConversationStore) -> None:
    model.script(
        *[Reply(calls=(Call("read_scratchpad", {}, f"c{i}"),), input_tokens=60, output_tokens=10) for i in range(5)]
    )
    run = await start(store, model, LoopLimits(max_tokens=100))
    with pytest.raises(TokenBudgetExhausted):
        await run.run([])
    assert run.turns == 2


@pytest.mark.parametrize(("max_tokens", "within"), [(101, True), (100, True), (99, False)], ids=["under", "at", "over"])
async def test_a_run_that_uses_exactly_its_token_budget_goes_on(
    model: ScriptedModel, store: ConversationStore, max_tokens: int, within: bool
) -> None:
    """Intended side: max_tokens bounds what the run may use, so usage equal to it is within the budget
    (LoopLimits.max_tokens; TokenBudgetExhausted says "over the budget"): the turn's tools run and the
    loop asks the model again. Only usage over it stops the run, before that turn's tools run."""
    model.script(
        Reply(calls=(Call("perform_web_search", {"query": "eiffel"}, "c1"),), input_tokens=60, output_tokens=40),
        Reply(content="330 m.", input_tokens=0, output_tokens=0),
    )
    run = await start(store, model, LoopLimits(max_tokens=max_tokens))
    searched: list[str] = []
    if within:
        assert await run.run(searched) == "330 m."
        assert (run.turns, searched) == (2, ["eiffel"])
    else:
        with pytest.raises(TokenBudgetExhausted, match="100 tokens used, over the budget of 99"):
            await run.run(searched)
        assert (run.turns, searched) == (1, [])
    assert run.usage.tokens == 100


@pytest.mark.parametrize("fault", [DropAfter("The tower is 3"), EndWithout("The tower is 3")], ids=["cut", "clean-end"])
async def test_provider_failure_propagates_and_partial_text_is_not_an_answer(
    model: ScriptedModel, store: ConversationStore, fault: DropAfter | EndWithout
) -> None:
    """A stream cut after partial text, or ended cleanly after it with no finish reason, is no answer."""
    model.script(Reply(calls=(Call("read_scratchpad", {}, "c1"),)), fault)
    run = await start(store, model, LoopLimits())
    with pytest.raises(ProviderError):
        await run.run([])
    history = await store.history("conv")
    assert all("The tower is 3" not in m.content for m in history), "partial prose was never recorded"
    assert run.turns == 2


async def test_text_protocol_end_to_end(model: ScriptedModel, store: ConversationStore) -> None:
    block = '<tool_call>{"name": "perform_web_search", "arguments": {"query": "eiffel"}}</tool_call>'
    model.script(Reply(content=f"Searching.\n{block}"), Reply(content="It is 330 m tall."))
    run = await start(store, model, LoopLimits(), native=False)
    searched: list[str] = []
    assert await run.run(searched) == "It is 330 m tall."
    assert searched == ["eiffel"]
    second = model.requests[1]["messages"]
    assert all(m["role"] != "tool" for m in second)
    assert '<tool_result id="t1-1">\nresults for eiffel\n</tool_result>' in second[-1]["content"]
    assert "tools" not in model.requests[1], "a model without native tools is not sent tool declarations"


async def test_a_run_interrupted_while_its_tools_run_goes_on_from_its_recorded_calls(
    model: ScriptedModel, store: ConversationStore
) -> None:
    """The answer is recorded before its tools run: a later run of the conversation runs the recorded calls
    without asking the model again, counts the recorded turn, and goes on."""
    started = asyncio.Event()
    hanging = True
    ran: list[str] = []

    async def slow(params: Empty, context: list[str]) -> str:
        ran.append("slow")
        if hanging:
            started.set()
            await asyncio.Event().wait()
        return "done at last"

    model.script(Reply(calls=(Call("slow", {}, "c1"),)), Reply(content="The answer."))
    await store.create("conv", [user("go")])
    client = ModelClient(ModelSettings(base_url=model.base_url, model="scripted", retry_budget=5))
    tools: ToolRegistry[list[str]] = ToolRegistry([Tool("slow", "slow", Empty, slow)])
    first = AgentRun(client, tools, store, "conv", LoopLimits(max_turns=2))
    running = asyncio.create_task(first.run([]))
    await started.wait()
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    recorded = await store.history("conv")
    assert [m.role for m in recorded] == ["user", "assistant"] and recorded[-1].tool_calls[0].id == "c1"
    assert unanswered_calls(recorded) == recorded[-1].tool_calls

    hanging = False
    second = AgentRun(client, tools, store, "conv", LoopLimits(max_turns=2))
    assert await second.run([]) == "The answer."
    assert ran == ["slow", "slow"], "the recorded call runs again, once"
    assert len(model.requests) == 2, "the recorded answer is not asked for again"
    assert second.turns == 2, "the recorded turn counts against the bound"
    history = await store.history("conv")
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[2].tool_call_id == "c1" and history[2].content == "done at last"
    assert unanswered_calls(history) == ()
