"""How `quarry up` restarts a service that dies: its own module, so that the command line's help can state the
defaults without loading the launcher (and gRPC with it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    """How often a service that keeps dying is restarted before `quarry up` gives up on its process group."""

    max_restarts: int = 5
    window_seconds: float = 600.0
    first_delay: float = 0.5
    max_delay: float = 30.0

    def delay(self, exits: int) -> float:
        """The wait before the restart that follows the `exits`-th exit within the window."""
        return float(min(self.first_delay * 2 ** (exits - 1), self.max_delay))
