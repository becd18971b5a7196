from __future__ import annotations

import json

from quarry.agent.messages import ToolCall, assistant, system, tool_result, user
from quarry.agent.text_protocol import instructions, parse_reply, render_history


def test_blocks_become_calls_and_prose_is_kept() -> None:
    text = (
        "I will search first.\n"
        '<tool_call>{"name": "perform_web_search", "arguments": {"query": "eiffel height"}}</tool_call>\n'
        '<tool_call>{"name": "read_scratchpad", "arguments": {}}</tool_call>'
    )
    reply = parse_reply(text, call_id_prefix="t3")
    assert reply.prose == "I will search first."
    assert [(c.id, c.name) for c in reply.calls] == [("t3-1", "perform_web_search"), ("t3-2", "read_scratchpad")]
    assert json.loads(reply.calls[0].arguments) == {"query": "eiffel height"}
    assert reply.errors == []


def test_blocks_inside_code_fences_are_examples_not_calls() -> None:
    text = (
        "Use this format:\n```\n"
        '<tool_call>{"name": "append_scratchpad", "arguments": {"content": "x"}}</tool_call>\n'
        "```\nNo calls from me."
    )
    reply = parse_reply(text, call_id_prefix="t1")
    assert reply.calls == []
    assert "No calls from me." in reply.prose


def test_malformed_blocks_are_reported_not_executed() -> None:
    text = (
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "x", "arguments": [1]}</tool_call>'
    )
    reply = parse_reply(text, call_id_prefix="t1")
    assert reply.calls == []
    assert len(reply.errors) == 3
    assert "not valid JSON" in reply.errors[0]


def test_history_renders_tool_results_as_user_blocks() -> None:
    call = ToolCall("t1-1", "read_scratchpad", "{}")
    rendered = render_history(
        [
            system("rules"),
            user("task"),
            assistant('<tool_call>{"name": "read_scratchpad", "arguments": {}}</tool_call>', (call,)),
            tool_result("t1-1", "seed: find the height"),
            assistant("The answer is 330 m."),
        ]
    )
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user", "assistant"]
    assert rendered[3]["content"] == '<tool_result id="t1-1">\nseed: find the height\n</tool_result>'
    assert all("tool_calls" not in m for m in rendered)


def test_instructions_list_every_tool() -> None:
    schema = {"type": "function", "function": {"name": "f", "description": "does f", "parameters": {"type": "object"}}}
    text = instructions([schema])
    assert "<tool_call>" in text and "- f: does f" in text
