"""Fitting a conversation into a token budget without breaking the tool protocol.

A provider rejects a history in which a tool result has no call, or a call has
no result. So the unit of truncation is the protocol group: an assistant
message that calls tools together with the results of those calls. Groups are
kept or dropped whole; tool messages are never merged; only ordinary adjacent
messages of one role may be merged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from quarry.agent.messages import Message

TokenCounter = Callable[[Message], int]


def estimate_tokens(message: Message) -> int:
    """A cheap, provider-neutral estimate (about four characters a token, plus framing)."""
    characters = len(message.content) + sum(len(c.name) + len(c.arguments) + len(c.id) for c in message.tool_calls)
    return 4 + characters // 4


def protocol_groups(messages: Sequence[Message]) -> list[list[Message]]:
    """Split a history into units that truncation keeps or drops whole.

    An assistant message with tool calls opens a group that takes every later
    tool result answering one of its calls. Any other message is a group of
    its own. A tool result that answers no earlier call in its group is an
    orphan: it is dropped, since no provider would accept it.
    """
    groups: list[list[Message]] = []
    open_calls: set[str] = set()
    for message in messages:
        if message.role == "tool":
            if message.tool_call_id in open_calls:
                groups[-1].append(message)
                open_calls.discard(message.tool_call_id)
            continue
        open_calls = {call.id for call in message.tool_calls}
        groups.append([message])
    return groups


def truncate(messages: Sequence[Message], budget: int, count: TokenCounter = estimate_tokens) -> list[Message]:
    """The history that fits `budget` tokens, keeping the head and the newest groups.

    The head (leading system messages and the first user message, i.e. the
    instructions and the task) is always kept. After it, groups are taken from
    the newest backwards while they fit; the first one that does not fit stops
    the walk, so what is kept is contiguous and ends with the latest turn.
    """
    groups = protocol_groups(messages)
    head_length = _head_length(groups)
    head, rest = groups[:head_length], groups[head_length:]
    remaining = budget - sum(count(m) for group in head for m in group)
    kept: list[list[Message]] = []
    for group in reversed(rest):
        cost = sum(count(m) for m in group)
        if cost > remaining:
            break
        kept.append(group)
        remaining -= cost
    return [m for group in [*head, *reversed(kept)] for m in group]


def _head_length(groups: Sequence[Sequence[Message]]) -> int:
    """Leading system messages, then the first user message."""
    length = 0
    while length < len(groups) and groups[length][0].role == "system":
        length += 1
    if length < len(groups) and groups[length][0].role == "user":
        length += 1
    return length


def merge_adjacent(messages: Sequence[Message]) -> list[Message]:
    """Merge neighbouring ordinary messages of the same role; protocol messages stay as they are."""
    merged: list[Message] = []
    for message in messages:
        previous = merged[-1] if merged else None
        if (
            previous is not None
            and not previous.is_protocol
            and not message.is_protocol
            and previous.role == message.role
            and message.role in ("user", "assistant")
        ):
            merged[-1] = Message(message.role, f"{previous.content}\n\n{message.content}")
        else:
            merged.append(message)
    return merged
