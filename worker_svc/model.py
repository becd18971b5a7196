"""Delegation domain types, free of protobuf and SQL."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime

from quarry.agent.usage import Usage
from quarry.identity import Role
from quarry.vocabulary import DelegationErrorCode


class DelegationState(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class DelegationRequest:
    delegation_id: str
    run_id: str
    tool_call_id: str
    scratchpad_thread_id: str
    objective: str
    criteria: tuple[str, ...] = ()
    input_refs: tuple[str, ...] = ()
    role: Role | None = Role.RESEARCHER  # None when the request named an unknown role
    max_turns: int = 0  # 0: the default
    timeout_seconds: float = 0.0  # 0: the server default
    max_tokens: int = 0  # 0: no token bound


@dataclass(frozen=True)
class Started:
    delegation_id: str
    conversation_id: str


@dataclass(frozen=True)
class Progress:
    delegation_id: str
    turn: int
    max_turns: int
    kind: str  # "turn", "tool" or "appended"
    summary: str
    tool_name: str = ""
    sequence_no: int = 0


@dataclass(frozen=True)
class Outcome:
    """The one terminal result of a delegation. A failure never carries a summary."""

    delegation_id: str
    tool_call_id: str
    conversation_id: str
    succeeded: bool
    summary: str = ""
    error_code: DelegationErrorCode | None = None
    error_message: str = ""
    promoted: tuple[int, ...] = ()
    turns: int = 0
    usage: Usage = field(default_factory=Usage)

    def to_json(self) -> dict[str, object]:
        return {
            "succeeded": self.succeeded,
            "summary": self.summary,
            "error_code": self.error_code.value if self.error_code else None,
            "error_message": self.error_message,
            "promoted": list(self.promoted),
            "turns": self.turns,
            **self.usage.to_json(),  # flat, as outcomes were always stored
        }

    @classmethod
    def from_json(cls, delegation_id: str, tool_call_id: str, conversation_id: str, data: dict[str, object]) -> Outcome:
        code = data.get("error_code")
        return cls(
            delegation_id=delegation_id,
            tool_call_id=tool_call_id,
            conversation_id=conversation_id,
            succeeded=bool(data["succeeded"]),
            summary=str(data.get("summary", "")),
            error_code=DelegationErrorCode(str(code)) if code else None,
            error_message=str(data.get("error_message", "")),
            promoted=tuple(int(n) for n in data.get("promoted", []) or []),  # type: ignore[attr-defined]
            turns=int(data.get("turns", 0)),  # type: ignore[call-overload]
            usage=Usage.from_json(data),
        )


Event = Started | Progress | Outcome


@dataclass(frozen=True)
class DelegationRecord:
    delegation_id: str
    run_id: str
    tool_call_id: str
    conversation_id: str
    scratchpad_thread_id: str
    role: Role
    objective: str
    criteria: tuple[str, ...]
    input_refs: tuple[str, ...]
    state: DelegationState
    outcome: Outcome | None
    last_error: str
    create_time: datetime
    end_time: datetime | None = None
