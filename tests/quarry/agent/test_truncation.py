"""Truncation never splits a tool group, never merges tool messages, and keeps the newest turns."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quarry.agent.messages import Message, ToolCall, assistant, system, tool_result, user
from quarry.agent.truncation import estimate_tokens, merge_adjacent, protocol_groups, truncate

text = st.text(alphabet="abcdefghij ", min_size=0, max_size=80)


@st.composite
def tool_group(draw: st.DrawFn, prefix: str) -> list[Message]:
    count = draw(st.integers(min_value=1, max_value=4))
    calls = tuple(ToolCall(id=f"{prefix}-{i}", name="perform_web_search", arguments='{"q": "x"}') for i in range(count))
    results = [tool_result(call.id, draw(text)) for call in calls]
    order = draw(st.permutations(results))  # parallel calls may answer in any order
    return [assistant(draw(text), calls), *order]


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    history = [system("You are a researcher."), user(draw(text) or "task")]
    for turn in range(draw(st.integers(min_value=0, max_value=12))):
        kind = draw(st.sampled_from(["tools", "assistant", "user"]))
        if kind == "tools":
            history.extend(draw(tool_group(f"t{turn}")))
        elif kind == "assistant":
            history.append(assistant(draw(text)))
        else:
            history.append(user(draw(text)))
    return history


def is_subsequence(part: list[Message], whole: list[Message]) -> bool:
    iterator = iter(whole)
    return all(any(candidate is message for candidate in iterator) for message in part)


def assert_protocol_valid(history: list[Message]) -> None:
    answered: set[str] = set()
    open_calls: set[str] = set()
    for message in history:
        if message.role == "tool":
            assert message.tool_call_id in open_calls, "a tool result without its call"
            open_calls.discard(message.tool_call_id)
            answered.add(message.tool_call_id)
        else:
            assert not open_calls, "a tool call left without its result"
            open_calls = {call.id for call in message.tool_calls}
    assert not open_calls, "a tool call left without its result"


@settings(max_examples=300, deadline=None)
@given(conversations(), st.integers(min_value=0, max_value=600))
def test_truncation_keeps_protocol_groups_whole(history: list[Message], budget: int) -> None:
    kept = truncate(history, budget)
    assert is_subsequence(kept, history)
    assert_protocol_valid(kept)
    assert kept[:2] == history[:2], "the instructions and the task are always kept"
    tool_messages = [m for m in kept if m.role == "tool"]
    assert len({m.tool_call_id for m in tool_messages}) == len(tool_messages), "tool results merged or duplicated"
    head_cost = sum(estimate_tokens(m) for m in kept[:2])
    assert sum(estimate_tokens(m) for m in kept) <= max(budget, head_cost)
    if kept[2:]:
        assert protocol_groups(kept)[-1] == protocol_groups(history)[-1], "the newest turn goes first"


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_enough_budget_keeps_everything(history: list[Message]) -> None:
    assert truncate(history, 10**9) == history


def test_a_group_that_does_not_fit_is_dropped_whole_and_stops_the_walk() -> None:
    calls = (ToolCall("a", "read_web_page", "{}"), ToolCall("b", "read_web_page", "{}"))
    history = [
        system("s"),
        user("task"),
        assistant("early"),
        assistant("", calls),
        tool_result("b", "x" * 400),
        tool_result("a", "y" * 400),
        assistant("latest"),
    ]
    budget = sum(estimate_tokens(m) for m in [*history[:2], history[-1]]) + 10
    assert truncate(history, budget) == [history[0], history[1], history[-1]]


def test_orphan_tool_results_are_dropped() -> None:
    history = [system("s"), user("task"), tool_result("nobody-called", "?"), assistant("done")]
    assert truncate(history, 10**6) == [history[0], history[1], history[3]]


def test_merge_joins_only_ordinary_neighbours() -> None:
    call = ToolCall("c1", "read_scratchpad", "{}")
    history = [
        user("one"),
        user("two"),
        assistant("", (call,)),
        tool_result("c1", "r1"),
        tool_result("c1", "r1 again"),
        assistant("a"),
        assistant("b"),
    ]
    merged = merge_adjacent(history)
    assert [m.role for m in merged] == ["user", "assistant", "tool", "tool", "assistant"]
    assert merged[0].content == "one\n\ntwo"
    assert merged[2:4] == history[3:5]
    assert merged[4].content == "a\n\nb"
