"""Open workspaces, kept durably: one small JSON file per workspace under the monitor's data directory.

A workspace's id is derived from its host and resolved root, so opening the same directory again,
or after a restart, gives the same id. Files are written atomically (a temporary file replaced
over the record) and read back on first use after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import uuid
from pathlib import Path

from monitor_svc.workspaces.types import WorkspaceRecord
from quarry.errors import FailedPrecondition, FieldViolation, InvalidArgument, NotFound

_ID = re.compile(r"ws-[0-9a-f]{16}")


def workspace_id(host: str, root: str) -> str:
    return "ws-" + hashlib.sha256(f"{host}\n{root}".encode()).hexdigest()[:16]


def check_workspace_id(value: str, field: str = "workspace_id") -> str:
    if not _ID.fullmatch(value):
        raise InvalidArgument([FieldViolation(field, "a workspace id: 'ws-' and 16 hex digits, from OpenWorkspace")])
    return value


def _load(path: Path) -> WorkspaceRecord | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return WorkspaceRecord(
            workspace_id=str(data["workspace_id"]),
            host=str(data["host"]),
            root=str(data["root"]),
            protected_paths=tuple(str(rule) for rule in data["protected_paths"]),
            allowed_root=str(data["allowed_root"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise FailedPrecondition(f"the workspace record {path} cannot be read: {error!r}") from error


def _store(path: Path, record: WorkspaceRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    data = {
        "workspace_id": record.workspace_id,
        "host": record.host,
        "root": record.root,
        "protected_paths": list(record.protected_paths),
        "allowed_root": record.allowed_root,
    }
    try:
        with temporary.open("w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


class WorkspaceRegistry:
    """Workspace records by id. `get` is what other parts of the monitor (jobs) resolve an id with."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._records: dict[str, WorkspaceRecord] = {}

    def _path(self, workspace_id: str) -> Path:
        return self._directory / f"{workspace_id}.json"

    async def find(self, workspace_id: str) -> WorkspaceRecord | None:
        """The record of a well-formed id, or None."""
        record = self._records.get(workspace_id)
        if record is None:
            record = await asyncio.to_thread(_load, self._path(workspace_id))
            if record is not None:
                self._records[workspace_id] = record
        return record

    async def get(self, workspace_id: str, field: str = "workspace_id") -> WorkspaceRecord:
        """The record (host, root, protected paths) of an open workspace; NOT_FOUND names the field."""
        record = await self.find(check_workspace_id(workspace_id, field))
        if record is None:
            raise NotFound("workspace", workspace_id, field=field)
        return record

    async def save(self, record: WorkspaceRecord) -> None:
        await asyncio.to_thread(_store, self._path(record.workspace_id), record)
        self._records[record.workspace_id] = record
