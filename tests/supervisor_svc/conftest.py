"""A whole mesh in this process (scratchpad, two workers, supervisor): real gRPC over real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from quarry.clients.channels import insecure_channel, open_channel
from quarry.clients.runs import RunsClient
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import QuarrySettings, ScratchpadSettings, SupervisorSettings, WorkerSettings
from quarry.identity import MeshRole
from quarry.mesh_auth import MeshKeys
from quarry.server import ServiceHost
from quarry.v1 import supervisor_pb2, worker_pb2, worker_pb2_grpc
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.service import build_host as build_supervisor
from tests.conftest import APPROVER_API_KEY, ServiceProcess, start_service, start_services, stop_service
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography, append_finding
from tests.fakes.openai_server import Call, Reply, ScriptedModel
from tests.fakes.web_server import FixtureWeb
from worker_svc.service import build_host as build_worker

HISTORY = """<!doctype html><html><head><title>Building the tower</title></head><body><article>
<h1>Building the tower</h1>
<p>Construction of the Eiffel Tower began in January 1887 and the tower opened to the public in May 1889.</p>
<p>About three hundred workers joined together some eighteen thousand pieces of wrought iron.</p>
</article></body></html>"""


async def delegation_on(address: str, delegation_id: str, token: str = "") -> worker_pb2.Delegation | None:
    """The delegation as the worker at `address` recorded it; None when that worker never ran it.

    `token`: the supervisor's mesh token, for a worker that authenticates its callers."""
    async with open_channel(address, token=token) as channel:
        try:
            response = await worker_pb2_grpc.WorkerServiceStub(channel).GetDelegation(
                worker_pb2.GetDelegationRequest(delegation_id=delegation_id)
            )
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND
            return None
    return response.delegation


@dataclass
class Mesh:
    supervisor: ServiceHost
    workers: list[ServiceHost]
    scratchpad_address: str
    client: RunsClient
    scratchpad: ScratchpadClient
    script: Choreography
    site: FixtureWeb
    supervisor_database_url: str
    # Another principal than the client's, holding only the approver role: a run's starter may not approve it.
    approver: RunsClient

    @property
    def worker_addresses(self) -> list[str]:
        return [worker.address for worker in self.workers]

    async def events(self, run_id: str, after: int = 0) -> list[supervisor_pb2.RunEvent]:
        return [event async for event in self.client.stream_run(run_id, after_sequence_no=after)]


def worker_settings(
    address: str, database: Path, scratchpad: str, model: ScriptedModel, site: FixtureWeb
) -> WorkerSettings:
    return WorkerSettings(
        address=address,
        database_url=f"sqlite:///{database}",
        scratchpad_address=scratchpad,
        model_base_url=model.base_url,
        model_name="scripted",
        search_backend="searxng",
        searxng_url=site.base_url,
        fetch_allow=f"127.0.0.1:{site.port}",
    )


@pytest.fixture
def supervisor_overrides(request: pytest.FixtureRequest) -> dict[str, object]:
    """Supervisor settings a test changes: parametrize this fixture indirectly, e.g. {"max_active_runs": 2}."""
    return dict(getattr(request, "param", {}))


@pytest.fixture
async def mesh(
    tmp_path: Path,
    model: ScriptedModel,
    site: FixtureWeb,
    database_url: str,
    supervisor_overrides: dict[str, object],
) -> AsyncIterator[Mesh]:
    """The supervisor's database is SQLite or PostgreSQL (each test runs on both)."""
    async with in_process_mesh(tmp_path, model, site, database_url, supervisor_overrides) as built:
        yield built


@asynccontextmanager
async def in_process_mesh(
    tmp_path: Path,
    model: ScriptedModel,
    site: FixtureWeb,
    database_url: str,
    supervisor_overrides: dict[str, object],
    script: Choreography | None = None,
) -> AsyncIterator[Mesh]:
    """The mesh the `mesh` fixture gives, for a caller outside pytest too (tests/replays/record.py)."""
    script = script or Choreography()
    model.default = script
    site.add("/history.html", HISTORY)
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=2)
    async with await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common) as scratchpad:
        workers = [
            await build_worker(
                worker_settings("127.0.0.1:0", tmp_path / f"worker{n}.db", scratchpad.address, model, site), common
            )
            for n in range(2)
        ]
        async with workers[0], workers[1]:
            supervisor = await build_supervisor(
                SupervisorSettings(
                    address="127.0.0.1:0",
                    database_url=database_url,
                    scratchpad_address=scratchpad.address,
                    worker_addresses=",".join(worker.address for worker in workers),
                    model_base_url=model.base_url,
                    model_name="scripted",
                    # These tests script the research phase; verification is asked for per run where tested.
                    **{"verify_runs": False, **supervisor_overrides},  # type: ignore[arg-type]
                ),
                common,
            )
            async with (
                supervisor,
                RunsClient.connect(supervisor.address) as client,
                RunsClient.connect(supervisor.address, api_key=APPROVER_API_KEY) as approver,
                insecure_channel(scratchpad.address) as channel,
            ):
                yield Mesh(
                    supervisor,
                    workers,
                    scratchpad.address,
                    client,
                    ScratchpadClient(channel),
                    script,
                    site,
                    database_url,
                    approver,
                )


@dataclass
class ProcessMesh:
    scratchpad: ServiceProcess
    workers: list[ServiceProcess]
    supervisor: ServiceProcess
    credentials: MeshKeys
    supervisor_env: dict[str, str]
    workdir: Path

    def start_supervisor(self, port: int = 0) -> ServiceProcess:
        """Another supervisor process over the same database (once the last one was stopped or killed), on `port`
        (0: any free one)."""
        self.supervisor = start_service("supervisor", self.supervisor_env, self.workdir, port=port)
        return self.supervisor

    @property
    def supervisor_token(self) -> str:
        """The supervisor's mesh token, for a test that reads what the supervisor may read."""
        return self.credentials.tokens[MeshRole.SUPERVISOR]


@contextmanager
def processes(
    tmp_path: Path,
    model: ScriptedModel,
    site: FixtureWeb,
    extra_env: dict[str, str] | None = None,
    *,
    shared_worker_database: bool = False,
) -> Iterator[ProcessMesh]:
    """Scratchpad, two workers and the supervisor as `quarry serve` processes (SQLite), stopped by SIGTERM.

    They authenticate each other with mesh tokens, as a deployment does. The workers have a database each,
    or, with `shared_worker_database`, share one (as `quarry up`'s do)."""
    credentials = MeshKeys.generate()
    common = {
        "QUARRY_DATA_DIR": str(tmp_path),
        "QUARRY_LOG_LEVEL": "WARNING",
        "QUARRY_SHUTDOWN_GRACE_SECONDS": "2",
        # Runs verify only where a test asks for it (RunOptions.verification), as its script covers it.
        "QUARRY_SUPERVISOR_VERIFY_RUNS": "false",
        **(extra_env or {}),
    }
    model_env = {"QUARRY_MODEL_BASE_URL": model.base_url, "QUARRY_MODEL_NAME": "scripted"}
    started: list[ServiceProcess] = []
    mesh: ProcessMesh | None = None
    try:
        scratchpad = start_service("scratchpad", {**common, **credentials.environment(None)}, tmp_path)
        started.append(scratchpad)
        worker_env = {
            **common,
            **model_env,
            **credentials.environment(MeshRole.WORKER),
            "QUARRY_WORKER_SCRATCHPAD_ADDRESS": scratchpad.address,
            "QUARRY_WORKER_SEARCH_BACKEND": "searxng",
            "QUARRY_WORKER_SEARXNG_URL": site.base_url,
            "QUARRY_WORKER_FETCH_ALLOW": f"127.0.0.1:{site.port}",
        }
        workers = start_services(
            [
                (
                    "worker",
                    {
                        **worker_env,
                        "QUARRY_WORKER_DATABASE_URL": f"sqlite:///{tmp_path / f'worker{database}.db'}",
                        # Over one database, the records say which worker ran what: worker-1, worker-2.
                        **({"QUARRY_WORKER_ID": f"worker-{n + 1}"} if shared_worker_database else {}),
                    },
                )
                for n, database in enumerate((0, 0) if shared_worker_database else (0, 1))
            ],
            tmp_path,
        )
        started.extend(workers)
        supervisor_env = {
            **common,
            **model_env,
            **credentials.environment(MeshRole.SUPERVISOR),
            "QUARRY_SUPERVISOR_SCRATCHPAD_ADDRESS": scratchpad.address,
            "QUARRY_SUPERVISOR_WORKER_ADDRESSES": ",".join(worker.address for worker in workers),
        }
        mesh = ProcessMesh(
            scratchpad,
            workers,
            start_service("supervisor", supervisor_env, tmp_path),
            credentials,
            supervisor_env,
            tmp_path,
        )
        yield mesh
    finally:
        if mesh is not None:
            started.append(mesh.supervisor)
        for service in reversed(started):
            stop_service(service)


def researcher(mesh: Mesh, objective: str, page: str, content: str, excerpt: str) -> None:
    """A worker that reads `page` of the fixture site and promotes one finding quoting it."""
    url = f"{mesh.site.base_url}{page}"
    mesh.script.add(
        objective,
        Reply(calls=(Call("read_web_page", {"url": url}, "read"),)),
        Reply(calls=(append_finding("promote", content, url, excerpt),)),
        Reply(content=f"Promoted: {content}"),
    )


def answer_at_once(mesh: Mesh, report: str = "Nothing was researched.") -> None:
    """The supervisor's model answers without delegating, then writes `report`."""
    mesh.script.add(SUPERVISOR, Reply(content="No research needed."))
    mesh.script.add(REPORT, Reply(content=report))


async def wait_for_phase(mesh: Mesh, run_id: str, phase: supervisor_pb2.ResearchPhase.ValueType) -> int:
    """The sequence number of the run's first status event in `phase`."""
    async for event in mesh.client.stream_run(run_id):
        if event.status.phase == phase:
            return event.sequence_no
    raise AssertionError("the run ended before that phase")
