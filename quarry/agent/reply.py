"""One completion put back together, from a stream's chunks or from a whole JSON answer.

Tool calls are assembled by id where indexes cannot tell them apart (Ollama sends every parallel call
with index 0, or none), and a name resent in every delta (some NIM and Fireworks deployments) is kept
once. When the server reports no usage, tokens are estimated from characters so budgets still hold.
"""

from __future__ import annotations

import math
from typing import Any

from quarry.agent.messages import ToolCall
from quarry.agent.usage import Usage

# Characters per token, for the estimate when a server reports no usage: English text and JSON run at
# about four in OpenAI's and Llama's tokenizers.
_CHARS_PER_TOKEN = 4


class AssembledReply:
    """Text, native tool calls, usage and finish reason, as chunks (or a whole completion) arrive."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.usage: Usage | None = None
        self.finish_reason = ""
        self._calls: list[dict[str, str]] = []
        # The latest call seen at each index, for deltas that continue it without an id.
        self._by_index: dict[int, dict[str, str]] = {}

    def add(self, chunk: dict[str, Any]) -> str:
        """Take one chunk; returns the text it added."""
        self._take_usage(chunk)
        added = []
        for choice in chunk.get("choices") or ():
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            delta = choice.get("delta") or {}
            if delta.get("content"):
                added.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                self._add_call(call)
        self.text.extend(added)
        return "".join(added)

    def add_completion(self, completion: dict[str, Any]) -> str:
        """Take a whole chat.completion (a server that ignored `stream: true`); returns its text."""
        self._take_usage(completion)
        choices = completion.get("choices") or [{}]
        choice = choices[0]
        self.finish_reason = choice.get("finish_reason") or ""
        message = choice.get("message") or {}
        content = message.get("content") or ""
        if content:
            self.text.append(content)
        for call in message.get("tool_calls") or ():
            self._calls.append(_slot(call))
        return content

    def finish(self, done: bool) -> str:
        """The finish reason; a stream that ended with [DONE] but none (vLLM, now and then) is complete:
        `tool_calls` when calls came, else `stop`. Empty: the server never said the reply was whole."""
        if self.finish_reason or not done:
            return self.finish_reason
        return "tool_calls" if self._calls else "stop"

    def _take_usage(self, data: dict[str, Any]) -> None:
        usage = data.get("usage")
        if usage:
            self.usage = Usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)

    def _add_call(self, call: dict[str, Any]) -> None:
        call_id, index = call.get("id") or "", call.get("index")
        slot = next((slot for slot in self._calls if call_id and slot["id"] == call_id), None)
        if slot is None and not call_id:
            # A continuation: of the latest call at its index, or of the latest call when it has none.
            slot = self._by_index.get(index) if index is not None else (self._calls[-1] if self._calls else None)
        if slot is None:
            slot = {"id": call_id, "name": "", "arguments": ""}
            self._calls.append(slot)
        if index is not None:
            self._by_index[index] = slot
        function = call.get("function") or {}
        name = function.get("name") or ""
        if name != slot["name"]:  # a name resent whole in each delta is the same name, not a longer one
            slot["name"] += name
        slot["arguments"] += function.get("arguments") or ""

    def tool_calls(self, call_id_prefix: str) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(slot["id"] or f"{call_id_prefix}-{index}", slot["name"], slot["arguments"] or "{}")
            for index, slot in enumerate(self._calls)
        )

    def estimated_usage(self, prompt_chars: int) -> Usage:
        """Tokens by characters, for a server that reported none."""
        completion_chars = sum(map(len, self.text)) + sum(len(s["name"]) + len(s["arguments"]) for s in self._calls)
        return Usage(_tokens(prompt_chars), _tokens(completion_chars), estimated_calls=1)


def _slot(call: dict[str, Any]) -> dict[str, str]:
    function = call.get("function") or {}
    arguments = function.get("arguments") or ""
    return {"id": call.get("id") or "", "name": function.get("name") or "", "arguments": arguments}


def _tokens(chars: int) -> int:
    return math.ceil(chars / _CHARS_PER_TOKEN)
