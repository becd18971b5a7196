"""The domain words more than one package speaks: entry kinds, entries and their sources, delegation errors.

The scratchpad stores entries; agents write and read them; the supervisor reports them. Each speaks of them
with these types, and quarry.convert translates them to and from quarry.v1 at the edges.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from quarry.identity import Principal

__all__ = [
    "DelegationErrorCode",
    "Entry",
    "EntryKind",
    "Source",
]


class EntryKind(enum.StrEnum):
    SEED = "seed"
    FINDING = "finding"
    MARKER = "marker"
    ACKNOWLEDGEMENT = "acknowledgement"
    NOTE = "note"
    VERDICT = "verdict"


@dataclass(frozen=True)
class Source:
    """What a claim rests on: a page that was read, and the words quoted from it."""

    url: str
    title: str = ""
    excerpt: str = ""


@dataclass(frozen=True)
class Entry:
    """One committed scratchpad entry."""

    thread_id: str
    sequence_no: int
    kind: EntryKind
    author: Principal
    content: str
    sources: tuple[Source, ...]
    create_time: datetime
    request_id: str = ""


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
