"""The services a Quarry mesh runs: the one list `serve`, `up`, `migrate` and `doctor` read.

Each service is named by "module:attribute" strings and imported lazily, so a
process loads only the service it runs (and the kernel never imports one).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from quarry.identity import MeshRole

if TYPE_CHECKING:  # the settings and the gRPC server load when a command needs them, not for its help
    from quarry.config import QuarrySettings, ServiceSettings
    from quarry.server import ServiceHost


@dataclass(frozen=True)
class Migrations:
    """A service's Alembic migrations; the service keeps the constants these point at."""

    scripts: str  # "module:attribute" naming the migrations folder (a Path)
    version_table: str  # "module:attribute" naming the table that records the revision (a str)

    def scripts_path(self) -> Path:
        return cast(Path, resolve(self.scripts))

    def version_table_name(self) -> str:
        return cast(str, resolve(self.version_table))


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    settings_class: str  # "module:Class"
    builder: str  # "module:function"
    # Services this one calls, and the variable through which `quarry up` tells it their address.
    needs: dict[str, str] = field(default_factory=dict)
    # None for a service without a database.
    migrations: Migrations | None = None
    # The mesh role its calls to other services carry; None for a service that calls no other.
    mesh_role: MeshRole | None = None
    # Services whose model tier (QUARRY_<SERVICE>_MODEL_*) this one also calls a model with.
    model_tiers: tuple[str, ...] = ()
    # Commands that run the service's code in the command's own process, without the service: name -> "module:function".
    commands: dict[str, str] = field(default_factory=dict)

    def settings_type(self) -> type[ServiceSettings]:
        return cast("type[ServiceSettings]", resolve(self.settings_class))

    def load_settings(self, **overrides: Any) -> ServiceSettings:
        from quarry.cli.settings import load_settings

        return load_settings(self.settings_type(), **overrides)

    def command(self, name: str) -> Callable[..., int]:
        """A command of the service's, imported only now."""
        return cast(Callable[..., int], resolve(self.commands[name]))

    async def build(self, settings: ServiceSettings, common: QuarrySettings) -> ServiceHost:
        build = cast("Callable[[ServiceSettings, QuarrySettings], Awaitable[ServiceHost]]", resolve(self.builder))
        return await build(settings, common)


def resolve(target: str) -> object:
    """The object a "module:attribute" string names, importing its module."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _migrations(package: str) -> Migrations:
    # Every service with a database declares both constants in its service module.
    return Migrations(scripts=f"{package}.service:MIGRATIONS", version_table=f"{package}.service:VERSION_TABLE")


# Start order for `quarry up`: dependencies first.
SERVICES: dict[str, ServiceSpec] = {
    "scratchpad": ServiceSpec(
        name="scratchpad",
        settings_class="quarry.config:ScratchpadSettings",
        builder="scratchpad_svc.service:build_host",
        migrations=_migrations("scratchpad_svc"),
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
        migrations=_migrations("worker_svc"),
        mesh_role=MeshRole.WORKER,
        model_tiers=("supervisor",),  # the citation auditor and the adjudicator run on workers
        commands={"corpus": "worker_svc.corpus_command:run", "papers": "worker_svc.papers_command:run"},
    ),
    "supervisor": ServiceSpec(
        name="supervisor",
        settings_class="quarry.config:SupervisorSettings",
        builder="supervisor_svc.service:build_host",
        needs={
            "scratchpad": "QUARRY_SUPERVISOR_SCRATCHPAD_ADDRESS",
            "worker": "QUARRY_SUPERVISOR_WORKER_ADDRESSES",
            "monitor": "QUARRY_SUPERVISOR_MONITOR_ADDRESS",
        },
        migrations=_migrations("supervisor_svc"),
        mesh_role=MeshRole.SUPERVISOR,
        commands={"keys": "supervisor_svc.access.command:run", "replay": "supervisor_svc.replay:run"},
    ),
}


def databases() -> list[tuple[ServiceSpec, Migrations]]:
    """The services that own a database, with their migrations, in start order."""
    return [(spec, spec.migrations) for spec in SERVICES.values() if spec.migrations is not None]
