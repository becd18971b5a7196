"""The shape of every identifier in the mesh, each defined once, and its check as a field violation.

Lengths follow the narrowest column that stores the id: a request_id is kept
in String(128) by the scratchpad, so 128 characters is the limit everywhere
(MAX_REQUEST_ID_CHARS, which the monitor's jobs and workspaces check too).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from quarry.errors import FieldViolation, InvalidArgument

__all__ = [
    "CAMPAIGN_ID",
    "DELEGATION_ID",
    "LABEL_KEY",
    "MAX_REQUEST_ID_CHARS",
    "PRINCIPAL_ID",
    "REQUEST_ID",
    "RUN_ID",
    "RUN_REFERENCE",
    "THREAD_ID",
    "TOOL_CALL_ID",
    "IdRule",
    "new_campaign_id",
    "new_conversation_id",
    "new_run_id",
    "violations",
]


@dataclass(frozen=True)
class IdRule:
    """One kind of identifier: the pattern it must match and how a violation describes that."""

    pattern: re.Pattern[str]
    shape: str

    def matches(self, value: str) -> bool:
        return self.pattern.fullmatch(value) is not None

    def check(self, field: str, value: str, *, when_missing: str | None = "required") -> FieldViolation | None:
        """The violation for `value` in `field`, or None. An empty value is fine when `when_missing` is None."""
        if not value:
            return None if when_missing is None else FieldViolation(field, when_missing)
        if not self.matches(value):
            return FieldViolation(field, f"must be {self.shape}")
        return None

    def require(self, field: str, value: str) -> None:
        """Raise InvalidArgument unless `value` is a valid, present id."""
        violation = self.check(field, value)
        if violation:
            raise InvalidArgument([violation])


def violations(*checks: FieldViolation | None) -> list[FieldViolation]:
    """The violations among some checks' results, for a request that reports all of them at once."""
    return [violation for violation in checks if violation is not None]


def _printable(max_chars: int) -> IdRule:
    # Printable ASCII without spaces: UUIDs, "run:call_abc", "delegation/42" all fit.
    return IdRule(
        re.compile(rf"[\x21-\x7e]{{1,{max_chars}}}"), f"1-{max_chars} printable ASCII characters without spaces"
    )


MAX_REQUEST_ID_CHARS = 128
REQUEST_ID = _printable(MAX_REQUEST_ID_CHARS)
# Ids callers choose, stored in String(256) columns.
PRINCIPAL_ID = _printable(256)
DELEGATION_ID = _printable(256)
TOOL_CALL_ID = _printable(256)
# A run as a delegation's caller names it; the supervisor's own run ids have the narrower RUN_ID shape.
RUN_REFERENCE = _printable(256)

THREAD_ID = IdRule(
    re.compile(r"[a-z0-9][a-z0-9-]{0,62}"), "1-63 characters of a-z, 0-9 and '-', starting with a letter or digit"
)
RUN_ID = IdRule(re.compile(r"run-[0-9a-f]{32}"), "a run id (run-<32 hex digits>)")
# Also the id of the campaign's scratchpad thread, so it has a thread id's shape too.
CAMPAIGN_ID = IdRule(re.compile(r"campaign-[0-9a-f]{32}"), "a campaign id (campaign-<32 hex digits>)")
LABEL_KEY = IdRule(
    re.compile(r"[a-z][a-z0-9_.-]{0,62}"), "1-63 lowercase letters, digits, _ . -, starting with a letter"
)


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex}"


def new_campaign_id() -> str:
    return f"campaign-{uuid.uuid4().hex}"


def new_conversation_id() -> str:
    return f"conv-{uuid.uuid4()}"
