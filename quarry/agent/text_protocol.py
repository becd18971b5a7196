"""Tool calling for models without native tools: `<tool_call>{json}</tool_call>` blocks in text.

The model is told the tools and the format in its system prompt; it answers
with prose and zero or more blocks. Blocks inside Markdown code fences are
examples, not calls, and are ignored. Results go back as `<tool_result>`
blocks in a user message, one per call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from quarry.agent.messages import Message, ToolCall

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[ \t]*$", re.DOTALL | re.MULTILINE)
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ParsedReply:
    prose: str
    calls: list[ToolCall] = field(default_factory=list)
    # Blocks that could not be read, described for the model.
    errors: list[str] = field(default_factory=list)


def instructions(tool_schemas: Sequence[dict[str, Any]]) -> str:
    """The system-prompt section that teaches the format."""
    lines = [
        "## Tools",
        "To call a tool, write a block exactly like this (one block per call, several allowed):",
        '<tool_call>{"name": "TOOL_NAME", "arguments": {"param": "value"}}</tool_call>',
        "Results come back in <tool_result> blocks. Blocks inside code fences are not executed.",
        "When you have the final answer, reply without any tool_call block.",
        "",
        "Available tools:",
    ]
    for schema in tool_schemas:
        function = schema["function"]
        lines.append(f"- {function['name']}: {function['description']}")
        lines.append(f"  parameters (JSON schema): {json.dumps(function['parameters'], separators=(',', ':'))}")
    return "\n".join(lines)


def parse_reply(text: str, *, call_id_prefix: str) -> ParsedReply:
    """Split a model's text into prose and tool calls; ids are `<prefix>-<n>`."""
    unfenced = _FENCE.sub("", text)
    calls: list[ToolCall] = []
    errors: list[str] = []
    for index, match in enumerate(_BLOCK.finditer(unfenced)):
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError as error:
            errors.append(f"tool_call block {index + 1} is not valid JSON ({error.msg})")
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            errors.append(f'tool_call block {index + 1} needs {{"name": ..., "arguments": {{...}}}}')
            continue
        arguments = payload.get("arguments", {})
        if not isinstance(arguments, dict):
            errors.append(f"tool_call block {index + 1}: arguments must be a JSON object")
            continue
        calls.append(ToolCall(f"{call_id_prefix}-{index + 1}", payload["name"], json.dumps(arguments)))
    prose = _BLOCK.sub("", unfenced).strip()
    return ParsedReply(prose=prose, calls=calls, errors=errors)


def render_history(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """A history with tool messages rewritten for a model that only knows text.

    An assistant message keeps its text (which contained the blocks); the
    results of its calls become one user message of `<tool_result>` blocks.
    """
    rendered: list[dict[str, Any]] = []
    pending_results: list[str] = []
    for message in messages:
        if message.role == "tool":
            pending_results.append(f'<tool_result id="{message.tool_call_id}">\n{message.content}\n</tool_result>')
            continue
        if pending_results:
            rendered.append({"role": "user", "content": "\n".join(pending_results)})
            pending_results = []
        rendered.append({"role": message.role, "content": message.content})
    if pending_results:
        rendered.append({"role": "user", "content": "\n".join(pending_results)})
    return rendered
