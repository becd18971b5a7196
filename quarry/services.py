"""The services a Quarry mesh runs, and how to build each one's host.

Services are imported lazily so one process loads only the service it runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

from quarry.config import QuarrySettings, ServiceSettings
from quarry.server import ServiceHost


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    settings_class: str  # "module:Class"
    builder: str  # "module:function"
    # Services this one calls, and the variable through which `quarry up` tells it their address.
    needs: dict[str, str] = field(default_factory=dict)

    def settings_type(self) -> type[ServiceSettings]:
        return cast(type[ServiceSettings], _load(self.settings_class))

    async def build(self, settings: ServiceSettings, common: QuarrySettings) -> ServiceHost:
        build = cast(Callable[[ServiceSettings, QuarrySettings], Awaitable[ServiceHost]], _load(self.builder))
        return await build(settings, common)


def _load(target: str) -> object:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


# Start order for `quarry up`: dependencies first.
SERVICES: dict[str, ServiceSpec] = {
    "scratchpad": ServiceSpec(
        name="scratchpad",
        settings_class="quarry.config:ScratchpadSettings",
        builder="scratchpad_svc.service:build_host",
    ),
    "monitor": ServiceSpec(
        name="monitor",
        settings_class="quarry.config:MonitorSettings",
        builder="monitor_svc.service:build_host",
    ),
    "worker": ServiceSpec(
        name="worker",
        settings_class="quarry.config:WorkerSettings",
        builder="worker_svc.service:build_host",
        needs={"scratchpad": "QUARRY_WORKER_SCRATCHPAD_ADDRESS", "monitor": "QUARRY_WORKER_MONITOR_ADDRESS"},
    ),
    "supervisor": ServiceSpec(
        name="supervisor",
        settings_class="quarry.config:SupervisorSettings",
        builder="supervisor_svc.service:build_host",
        needs={"scratchpad": "QUARRY_SUPERVISOR_SCRATCHPAD_ADDRESS", "worker": "QUARRY_SUPERVISOR_WORKER_ADDRESSES"},
    ),
}
