"""Domain enums more than one package speaks: the scratchpad stores entry kinds, agents write and read them."""

from __future__ import annotations

import enum

__all__ = [
    "EntryKind",
]


class EntryKind(enum.StrEnum):
    SEED = "seed"
    FINDING = "finding"
    MARKER = "marker"
    ACKNOWLEDGEMENT = "acknowledgement"
    NOTE = "note"
    VERDICT = "verdict"
    SYNTHESIS = "synthesis"
