"""The API key of a `quarry up`: principal "local" with every role, its secret only in <data dir>/api-key
(mode 0600), where the command line on the same machine finds it; the supervisor gets its digest."""

from __future__ import annotations

import os
from pathlib import Path

from quarry.api_auth import ALL_ROLES, API_KEY_FILE, new_api_key, static_key_entry
from quarry.config import ConfigurationError, SupervisorSettings

__all__ = ["LOCAL_PRINCIPAL", "ensure_api_key", "supervisor_api_environment"]

LOCAL_PRINCIPAL = "local"


def ensure_api_key(data_dir: Path) -> str:
    """The key in <data dir>/api-key, made now unless it exists (a restarted `quarry up` keeps it)."""
    path = data_dir / API_KEY_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    key = new_api_key()
    try:
        # Created with its final mode, and never over an existing file (O_EXCL): no moment when others can read it.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        existing = path.read_text().strip()
        if not existing:
            raise ConfigurationError(f"{path} is empty: remove it, and `quarry up` makes a new key") from None
        return existing
    with os.fdopen(descriptor, "w") as handle:
        handle.write(key + "\n")
    return key


def supervisor_api_environment(data_dir: Path, settings: SupervisorSettings, *, open_api: bool) -> dict[str, str]:
    """What the supervisor of a `quarry up` is told about its callers, on top of its own settings.

    The configured static keys stay valid; the local key is added to them. Open (`--open-api`), the
    supervisor gets no monitor: it refuses an open API while campaigns can run code.
    """
    if open_api:
        return {"QUARRY_SUPERVISOR_OPEN_API": "true", "QUARRY_SUPERVISOR_MONITOR_ADDRESS": ""}
    local = static_key_entry(LOCAL_PRINCIPAL, ALL_ROLES, ensure_api_key(data_dir))
    configured = settings.api_keys.strip().strip(",")
    return {"QUARRY_SUPERVISOR_API_KEYS": f"{configured},{local}" if configured else local}
