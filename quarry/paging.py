"""Page tokens: a service's cursor text, carried to the client and back as an opaque string.

Each service writes its own versioned cursor (what it needs to resume a listing and to check the
token came from the same query); the encoding is the same everywhere, so it lives here.
"""

from __future__ import annotations

import base64
import binascii

__all__ = ["decode_token", "encode_token"]


def encode_token(cursor: str) -> str:
    """The cursor as URL-safe base64 without padding: opaque to clients, safe in a URL."""
    return base64.urlsafe_b64encode(cursor.encode()).decode().rstrip("=")


def decode_token(token: str) -> str | None:
    """The cursor inside a token from `encode_token`; None for a string that cannot be one.

    Only the exact text `encode_token` writes decodes: base64 decoding would otherwise skip stray
    characters and accept padding, so many strings would stand for one token.
    """
    try:
        cursor = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return cursor if encode_token(cursor) == token else None
