"""Capabilities: the names roles have always subscribed by, each expanded into tools."""

from __future__ import annotations

from worker_svc.capabilities import MONITOR_CAPABILITIES, Capability
from worker_svc.roles import ROLES
from worker_svc.tools import CAPABILITIES


def test_capabilities_keep_their_names_and_each_has_tools() -> None:
    assert {str(capability) for capability in Capability} == {
        "web_search",
        "read_pages",
        "scratchpad",
        "read_scratchpad",
        "literature",
        "papers",
        "search",
        "compute",
        "workspace",
    }
    assert set(CAPABILITIES) == set(Capability), "every capability expands into tools"
    assert {str(capability) for capability in MONITOR_CAPABILITIES} == {"compute", "workspace"}


def test_only_roles_with_monitor_capabilities_need_a_monitor() -> None:
    assert {role for role, spec in ROLES.items() if spec.needs_monitor} == {
        role for role, spec in ROLES.items() if Capability.WORKSPACE in spec.capabilities
    }
