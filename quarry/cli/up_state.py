"""Where a running `quarry up` serves, for the other commands: a state file in its data directory.

`quarry up` writes `mesh.json` once every service serves (again when a restart changes a process)
and removes it when it stops; one left behind by an `up` that was killed names a pid no longer
alive, and is ignored. It holds addresses and process ids, never a credential, and only its owner
may read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Its name predates this module's: kept, so commands of either release find a running `quarry up`.
STATE_FILE = "mesh.json"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


@dataclass(frozen=True)
class UpState:
    """What one running `quarry up` serves: its services' addresses and its processes."""

    # The `quarry up` process.
    pid: int
    # Service ("worker") -> the addresses its processes serve on, in start order.
    services: Mapping[str, Sequence[str]]
    # Process name ("worker-2") -> its pid now.
    processes: Mapping[str, int]

    def write(self, data_dir: Path) -> None:
        """Replace the state file atomically: a reader sees the old one or the new one, never half."""
        path = data_dir / STATE_FILE
        partial = path.with_name(f".{STATE_FILE}.{self.pid}")
        document = {
            "pid": self.pid,
            "services": {name: list(addresses) for name, addresses in self.services.items()},
            "processes": dict(self.processes),
        }
        # Its owner's alone (0600), as everything in the data directory; the rename keeps the mode.
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(descriptor, 0o600)  # a partial file left by a killed `up` keeps the mode it had
        with open(descriptor, "w") as handle:
            handle.write(json.dumps(document, indent=2) + "\n")
        partial.replace(path)

    @classmethod
    def read(cls, data_dir: Path) -> UpState | None:
        """The state of the `quarry up` running on `data_dir`; None when none is (or the file is unreadable)."""
        try:
            document = json.loads((data_dir / STATE_FILE).read_text())
            state = cls(
                pid=int(document["pid"]),
                services={str(name): [str(a) for a in addresses] for name, addresses in document["services"].items()},
                processes={str(name): int(pid) for name, pid in document.get("processes", {}).items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return state if pid_alive(state.pid) else None

    @staticmethod
    def remove(data_dir: Path, pid: int) -> None:
        """Remove the state file if it is `pid`'s: a later `up` may have written its own."""
        path = data_dir / STATE_FILE
        try:
            if int(json.loads(path.read_text())["pid"]) == pid:
                path.unlink()
        except (OSError, ValueError, KeyError, TypeError):
            pass
