"""Every Quarry service in this process (scratchpad, worker, supervisor, monitor), over real gRPC.

For tests that call every service the same way (bad bytes, the fuzz test): the services
run on SQLite, the model and the web are the loopback fakes, the monitor has no SSH hosts.
Workspaces may be opened under `workspaces/` in the temporary directory.
They authenticate each other as a deployed mesh does; a test calls the internal services with
the supervisor's mesh credential, `Services.metadata`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from monitor_svc.service import SERVICE_NAME as MONITOR
from monitor_svc.service import build_host as build_monitor
from quarry.config import (
    MonitorSettings,
    QuarrySettings,
    ScratchpadSettings,
    SupervisorSettings,
    WorkerSettings,
)
from quarry.identity import MeshRole
from quarry.mesh_auth import MeshKeys
from quarry.security import bearer_metadata
from scratchpad_svc.service import SERVICE_NAME as SCRATCHPAD
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.service import CAMPAIGN_SERVICE as CAMPAIGN
from supervisor_svc.service import SERVICE_NAME as SUPERVISOR
from supervisor_svc.service import build_host as build_supervisor
from tests.conftest import TEST_API_KEY
from tests.fakes.openai_server import Reply, ScriptedModel
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.campaign_loops import WaitingLoops
from worker_svc.service import SERVICE_NAME as WORKER
from worker_svc.service import build_host as build_worker

__all__ = ["CAMPAIGN", "MONITOR", "SCRATCHPAD", "SUPERVISOR", "WORKER", "Services", "every_service"]


@dataclass(frozen=True)
class Services:
    # Full service name -> the address serving it.
    addresses: dict[str, str]
    model: ScriptedModel
    site: FixtureWeb
    # The mesh token of each role.
    mesh_tokens: dict[MeshRole, str] = field(default_factory=dict)
    supervisor_token: str = ""

    def token(self, service: str) -> str:
        """What a caller acting for the supervisor presents to `service`: the client token, or its mesh token."""
        public = service in (SUPERVISOR, CAMPAIGN)
        return self.supervisor_token if public else self.mesh_tokens[MeshRole.SUPERVISOR]

    def metadata(self, service: str) -> tuple[tuple[str, str], ...]:
        return bearer_metadata(self.token(service))


@contextlib.asynccontextmanager
async def every_service(tmp_path: Path, *, supervisor_token: str = "") -> AsyncIterator[Services]:
    """Scratchpad, one worker, the supervisor (with campaigns, driven by a stand-in loop that waits) and the
    monitor, each on its own port; the model answers every request with a short final reply, so
    delegations and runs end quickly."""
    keys = MeshKeys.generate()
    tokens = dict(keys.tokens)
    peers = keys.peers().render()
    shared = {"data_dir": tmp_path, "shutdown_grace_seconds": 1, "mesh_peers": peers, "mesh_insecure": False}
    common = QuarrySettings(**shared)
    as_worker = QuarrySettings(**shared, mesh_token=tokens[MeshRole.WORKER])
    as_supervisor = QuarrySettings(**shared, mesh_token=tokens[MeshRole.SUPERVISOR])
    async with contextlib.AsyncExitStack() as stack:
        model = await stack.enter_async_context(ScriptedModel(default=lambda _body: Reply("nothing to add")))
        site = await stack.enter_async_context(FixtureWeb())
        scratchpad = await build_scratchpad(
            ScratchpadSettings(address="127.0.0.1:0", database_url=f"sqlite:///{tmp_path / 'scratchpad.db'}"), common
        )
        await stack.enter_async_context(scratchpad)
        worker = await build_worker(
            WorkerSettings(
                address="127.0.0.1:0",
                database_url=f"sqlite:///{tmp_path / 'worker.db'}",
                scratchpad_address=scratchpad.address,
                model_base_url=model.base_url,
                model_name="scripted",
                search_backend="searxng",
                searxng_url=site.base_url,
                fetch_allow=f"127.0.0.1:{site.port}",
            ),
            as_worker,
        )
        await stack.enter_async_context(worker)
        supervisor = await build_supervisor(
            SupervisorSettings(
                address="127.0.0.1:0",
                database_url=f"sqlite:///{tmp_path / 'supervisor.db'}",
                scratchpad_address=scratchpad.address,
                worker_addresses=worker.address,
                model_base_url=model.base_url,
                model_name="scripted",
                auth_token=supervisor_token,
            ),
            as_supervisor,
            campaign_loop=WaitingLoops(),
        )
        await stack.enter_async_context(supervisor)
        monitor = await build_monitor(
            MonitorSettings(
                address="127.0.0.1:0",
                jobs_dir=str(tmp_path / "jobs"),
                allow_job_submission=True,
                workspace_roots=[str(tmp_path / "workspaces")],
            ),
            common,
        )
        await stack.enter_async_context(monitor)
        yield Services(
            {
                SCRATCHPAD: scratchpad.address,
                WORKER: worker.address,
                SUPERVISOR: supervisor.address,
                CAMPAIGN: supervisor.address,
                MONITOR: monitor.address,
            },
            model,
            site,
            tokens,
            supervisor_token or TEST_API_KEY,
        )
