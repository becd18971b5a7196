"""Domain enums more than one package speaks: the scratchpad stores entry kinds, agents write and read them."""

from __future__ import annotations

import enum

__all__ = [
    "DelegationErrorCode",
    "EntryKind",
]


class EntryKind(enum.StrEnum):
    SEED = "seed"
    FINDING = "finding"
    MARKER = "marker"
    ACKNOWLEDGEMENT = "acknowledgement"
    NOTE = "note"
    VERDICT = "verdict"


class DelegationErrorCode(enum.StrEnum):
    """Why a delegation failed, said alike by the worker that ran it and the supervisor that asked."""

    PROVIDER_ERROR = "provider_error"
    TURN_BUDGET_EXHAUSTED = "turn_budget_exhausted"
    TOKEN_BUDGET_EXHAUSTED = "token_budget_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    INVALID_TASK = "invalid_task"
    WORKER_UNAVAILABLE = "worker_unavailable"
    PROTOCOL_VIOLATION = "protocol_violation"
    INTERNAL = "internal"
