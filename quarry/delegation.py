"""The vocabulary of a delegation shared by the side that asks (supervisor) and the side that works (worker)."""

from __future__ import annotations

import enum


class DelegationErrorCode(enum.StrEnum):
    """Why a delegation failed; budgets, deadline and cancellation are distinct."""

    PROVIDER_ERROR = "provider_error"
    TURN_BUDGET_EXHAUSTED = "turn_budget_exhausted"
    TOKEN_BUDGET_EXHAUSTED = "token_budget_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    INVALID_TASK = "invalid_task"
    WORKER_UNAVAILABLE = "worker_unavailable"
    PROTOCOL_VIOLATION = "protocol_violation"
    INTERNAL = "internal"
