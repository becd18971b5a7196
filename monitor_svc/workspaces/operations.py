"""The workspace operations, written once over a Backend: open, describe, list, read, search, write, patch, git.

The read side (reads.py) and the write side (writes.py) share how a workspace is found, how its
paths are resolved and how git runs in it (access.py).
"""

from __future__ import annotations

from monitor_svc.workspaces.reads import WorkspaceReads
from monitor_svc.workspaces.writes import WorkspaceWrites


class Workspaces(WorkspaceReads, WorkspaceWrites):
    """Every workspace operation, as the RPCs and jobs use them."""
