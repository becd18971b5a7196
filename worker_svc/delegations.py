"""Delegation domain types: a request, its events, its record; free of protobuf and SQL."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from quarry.identity import Role
from quarry.vocabulary import DelegationResult, Tier


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
    workspace_id: str = ""  # an engineer's workspace (the monitor's id); empty for every other role
    question: str = ""  # the run's research question, part of a blind role's contract
    tier: Tier | None = None  # None: the role's default


@dataclass(frozen=True)
class Started:
    delegation_id: str
    conversation_id: str
    worker_id: str = ""
    tier: Tier | None = None
    model: str = ""


@dataclass(frozen=True)
class Progress:
    delegation_id: str
    turn: int
    max_turns: int
    kind: str  # "turn", "tool" or "appended"
    summary: str
    tool_name: str = ""
    sequence_no: int = 0


Event = Started | Progress | DelegationResult


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
    outcome: DelegationResult | None
    last_error: str
    create_time: datetime
    end_time: datetime | None = None
    worker_id: str = ""  # empty for delegations recorded before workers had an id
    workspace_id: str = ""
    question: str = ""
    tier: Tier | None = None  # None for delegations recorded before tiers
    # Ended from outside (its caller went away, its worker stopped): the same Delegate goes on with it.
    interrupted: bool = False
