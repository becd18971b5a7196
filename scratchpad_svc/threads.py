"""The scratchpad's domain types (threads, append commands and their results), free of protobuf and SQL."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime

from quarry.identity import Role
from quarry.vocabulary import Entry, EntryKind, Source


@dataclass(frozen=True)
class Thread:
    thread_id: str
    title: str
    labels: dict[str, str]
    create_time: datetime
    last_sequence_no: int


@dataclass(frozen=True)
class NewThread:
    """A CreateThread request; thread_id and request_id may be empty."""

    thread_id: str = ""
    title: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    request_id: str = ""


@dataclass(frozen=True)
class AppendCommand:
    """An Append request as received. kind and role are None when unknown or unspecified."""

    thread_id: str
    request_id: str
    kind: EntryKind | None
    author_id: str
    role: Role | None
    content: str
    sources: tuple[Source, ...] = ()

    def fingerprint(self) -> str:
        """Identifies the payload, so a reused request_id with other content is caught."""
        return self._fingerprint

    @functools.cached_property
    def _fingerprint(self) -> str:  # an append asks for it more than once
        payload = [
            self.kind,
            self.author_id,
            self.role,
            self.content,
            [[s.url, s.title, s.excerpt] for s in self.sources],
        ]
        return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class AppendResult:
    entry: Entry
    replayed: bool
