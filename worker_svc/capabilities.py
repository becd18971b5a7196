"""The capabilities a role subscribes to: logical names, each expanded into tools by worker_svc/tools.py.

The values are the names the roles table and the tools' catalogue have always used.
"""

from __future__ import annotations

import enum


class Capability(enum.StrEnum):
    WEB_SEARCH = "web_search"
    # Reading given pages without searching for others (a verifier re-reads what a finding cites).
    READ_PAGES = "read_pages"
    SCRATCHPAD = "scratchpad"
    READ_SCRATCHPAD = "read_scratchpad"
    # Looking papers up in the literature catalogues (arXiv, Semantic Scholar), whatever the search backend.
    LITERATURE = "literature"
    # The literature skills: new arXiv papers, citation snowballing, venue search (worker_svc/web/papers.py).
    PAPERS = "papers"
    # Searching without reading: a scout lists what it found, for others to read.
    SEARCH = "search"
    # The monitor's GPU and job status.
    COMPUTE = "compute"
    # An engineer's, bound to its delegation's workspace (worker_svc/workspace_tools.py).
    WORKSPACE = "workspace"


# Capabilities whose tools ask the monitor: only a worker configured with one has them.
MONITOR_CAPABILITIES = frozenset({Capability.COMPUTE, Capability.WORKSPACE})
