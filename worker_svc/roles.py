"""The roles a worker runs: for each, the tools it may use and its standing instructions.

A role's authority is this table, enforced in code: a tool not in a role's capabilities is never
offered to its model, whatever the task says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from quarry.identity import Role

# Capabilities whose tools ask the monitor: only a worker configured with one has them.
MONITOR_CAPABILITIES = frozenset({"compute", "workspace"})


@dataclass(frozen=True)
class RoleSpec:
    instructions: str
    # Logical capabilities (worker_svc/tools.py expands them into tools).
    capabilities: tuple[str, ...]
    # Capabilities the role also gets when this worker has what they need (e.g. a monitor for "compute").
    optional_capabilities: tuple[str, ...] = ()

    def capabilities_given(self, available: frozenset[str]) -> list[str]:
        return [*self.capabilities, *(c for c in self.optional_capabilities if c in available)]

    @property
    def works_in_workspace(self) -> bool:
        """Its delegations name the one workspace its tools are bound to (and no other role's may)."""
        return "workspace" in self.capabilities

    @property
    def needs_monitor(self) -> bool:
        """The role cannot run on a worker without a monitor (its own tools ask it)."""
        return not MONITOR_CAPABILITIES.isdisjoint(self.capabilities)


ROLES: Mapping[Role, RoleSpec] = MappingProxyType(
    {
        Role.RESEARCHER: RoleSpec(
            instructions=(
                "You are a research worker. Read the shared scratchpad first: it holds the task's seed and what "
                "other workers found. Search, read pages, and verify. Promote only verified findings with "
                "append_scratchpad (kind 'finding'), each citing pages you read in this task with excerpts quoted "
                "exactly. Add a 'marker' or an 'acknowledgement' when the task asks for one. Finish with a short "
                "summary of what you promoted."
            ),
            capabilities=("web_search", "scratchpad"),
            optional_capabilities=("compute",),
        ),
        Role.VERIFIER: RoleSpec(
            instructions=(
                "You are a verifier. Read the scratchpad, re-read the sources the findings cite, and record a "
                "'verdict' for each finding you checked, quoting the passage that supports or contradicts it. "
                "Finish with a short summary of your verdicts."
            ),
            capabilities=("web_search", "scratchpad"),
        ),
        # Works in the one workspace its delegation names (the tools are bound to it): reads and edits
        # its code, smoke-tests it, launches experiments. Never offered to researchers or verifiers.
        Role.ENGINEER: RoleSpec(
            instructions=(
                "You are an engineer working in one code workspace. Read before you change anything: "
                "list_tree, read_file and search_code show the code. Change files with apply_patch (a unified "
                "diff) or write_file; protected paths (the evaluation harness, the data) are read-only. Check a "
                "change with run_command, a short smoke test that is stopped past its limit; then start the real "
                "run with launch_experiment, giving its wall-clock limit, GPUs and the metrics to read from its "
                "log or metrics file: it returns the job's id at once and runs on its own (job_status shows it). "
                "Add a 'note' to the scratchpad when the task asks for one. Finish with a short summary of what "
                "you changed and launched."
            ),
            capabilities=("workspace", "scratchpad"),
        ),
    }
)
