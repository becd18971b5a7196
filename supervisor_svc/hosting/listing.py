"""Page tokens of the supervisor's newest-first listings (runs, campaigns): a filter, a create time, an id.

Only the exact form written here is accepted back (an aware UTC timestamp as `isoformat` writes it,
and an id of the listing's own shape), so nothing a client crafts reaches a query as a naive,
out-of-range or NUL value.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from quarry import ids, paging
from quarry.errors import FieldViolation, InvalidArgument


def encode_page_token(state: str, create_time: datetime, key: str) -> str:
    return paging.encode_token(f"v1|{state}|{create_time.isoformat()}|{key}")


def decode_page_token(token: str, state: str, key: ids.IdRule, method: str) -> tuple[datetime, str]:
    """The (create time, id) a token from `encode_page_token` names; INVALID_ARGUMENT for any other string."""
    parts = (paging.decode_token(token) or "").split("|")
    if len(parts) == 4:
        version, token_state, when, value = parts
        moment = _utc_timestamp(when)
        if version == "v1" and token_state == state and moment is not None and key.matches(value):
            return moment, value
    raise InvalidArgument([FieldViolation("page_token", f"not a token from a {method} call with the same filter")])


def _utc_timestamp(text: str) -> datetime | None:
    """`text` as a datetime when it is exactly what `isoformat` writes for an aware UTC datetime."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None or moment.utcoffset() != timedelta(0) or moment.isoformat() != text:
        return None
    return moment
