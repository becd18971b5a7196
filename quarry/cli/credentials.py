"""Which API key the command line sends to the supervisor, and where it found it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from quarry.api_auth import API_KEY_FILE
from quarry.config import ConfigurationError, QuarrySettings

__all__ = ["Credential", "api_credential"]


@dataclass(frozen=True)
class Credential:
    key: str
    # Where it came from, for `quarry doctor` (never the key itself); "" when none was found.
    source: str


def api_credential(common: QuarrySettings, auth_token: str) -> Credential:
    """In order: QUARRY_API_KEY, QUARRY_SUPERVISOR_AUTH_TOKEN (`auth_token`), then the key `quarry up` wrote
    in the data directory."""
    if key := os.environ.get("QUARRY_API_KEY", "").strip():
        return Credential(key, "QUARRY_API_KEY")
    if auth_token:
        return Credential(auth_token, "QUARRY_SUPERVISOR_AUTH_TOKEN")
    path = common.data_dir / API_KEY_FILE
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        return Credential("", "")
    except OSError as error:
        raise ConfigurationError(f"cannot read the API key in {path}: {error.strerror}") from error
    return Credential(key, str(path))
