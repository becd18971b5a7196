"""Provider-neutral chat messages, shaped like the OpenAI chat format they are sent as."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """One function call a model asked for. `arguments` is the raw JSON text the model wrote."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    role: Role
    content: str = ""
    # Set on assistant messages that call tools.
    tool_calls: tuple[ToolCall, ...] = field(default_factory=tuple)
    # Set on tool results: the call this message answers.
    tool_call_id: str = ""

    @property
    def is_protocol(self) -> bool:
        """Protocol messages are atomic: never merged, and dropped only with their whole group."""
        return self.role == "tool" or bool(self.tool_calls) or bool(self.tool_call_id)

    def to_openai(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in self.tool_calls
            ]
            if not self.content:
                message["content"] = None
        if self.role == "tool":
            message["tool_call_id"] = self.tool_call_id
        return message


def system(content: str) -> Message:
    return Message("system", content)


def user(content: str) -> Message:
    return Message("user", content)


def assistant(content: str = "", tool_calls: tuple[ToolCall, ...] = ()) -> Message:
    return Message("assistant", content, tool_calls=tool_calls)


def tool_result(tool_call_id: str, content: str) -> Message:
    return Message("tool", content, tool_call_id=tool_call_id)
