"""Every Quarry service in this process (scratchpad, worker, supervisor, monitor), over real gRPC.

For tests that call every service the same way (bad bytes, the fuzz test): the services
run on SQLite, the model and the web are the loopback fakes, the monitor has no SSH hosts.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
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
from scratchpad_svc.service import SERVICE_NAME as SCRATCHPAD
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.service import SERVICE_NAME as SUPERVISOR
from supervisor_svc.service import build_host as build_supervisor
from tests.fakes.openai_server import Reply, ScriptedModel
from tests.fakes.web_server import FixtureWeb
from worker_svc.service import SERVICE_NAME as WORKER
from worker_svc.service import build_host as build_worker

__all__ = ["MONITOR", "SCRATCHPAD", "SUPERVISOR", "WORKER", "Services", "every_service"]


@dataclass(frozen=True)
class Services:
    # Full service name -> the address serving it.
    addresses: dict[str, str]
    model: ScriptedModel
    site: FixtureWeb


@contextlib.asynccontextmanager
async def every_service(tmp_path: Path, *, supervisor_token: str = "") -> AsyncIterator[Services]:
    """Scratchpad, one worker, the supervisor and the monitor, each on its own port; the model
    answers every request with a short final reply, so delegations and runs end quickly."""
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1)
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
            common,
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
            common,
        )
        await stack.enter_async_context(supervisor)
        monitor = await build_monitor(MonitorSettings(address="127.0.0.1:0", jobs_dir=str(tmp_path / "jobs")), common)
        await stack.enter_async_context(monitor)
        yield Services(
            {
                SCRATCHPAD: scratchpad.address,
                WORKER: worker.address,
                SUPERVISOR: supervisor.address,
                MONITOR: monitor.address,
            },
            model,
            site,
        )
