"""Fixtures shared by every test: databases (SQLite and the real PostgreSQL) and processes."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import make_url

from quarry.api_auth import ALL_ROLES, new_api_key, static_key_entry
from quarry.cli.launcher import serve_command
from quarry.db import create_engine
from quarry.identity import ApiRole
from quarry.migrations import upgrade_schema
from tests.fakes.loopback import served_in_thread
from tests.fakes.openai_server import ScriptedModel
from tests.fakes.otlp import Collector, serving_collector
from tests.fakes.web_server import FixtureWeb

# The public API's keys in every test: the supervisors started here accept them (QUARRY_SUPERVISOR_API_KEYS),
# and the clients send the first (QUARRY_API_KEY). Approving a run needs another principal than its starter's.
TEST_API_KEY = new_api_key()
APPROVER_API_KEY = new_api_key()
TEST_API_KEYS = ",".join(
    [
        static_key_entry("tester", ALL_ROLES, TEST_API_KEY),
        static_key_entry("approver", {ApiRole.APPROVER}, APPROVER_API_KEY),
    ]
)

POSTGRES_URL = os.environ.get("QUARRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgresql"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that mostly wait on a clock outside them (Slurm's time limit, say) first, in their own order: each
    worker starts with its share of them, so they overlap the rest of the suite instead of ending it."""
    items.sort(key=lambda item: item.get_closest_marker("long_wait") is None)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: twice as many workers as cores. Much of the suite's time is spent waiting on processes it
    starts (services coming up, jobs, the fake model), which the extra workers fill: on two cores, 4 workers
    ran the suite in 258 s where 3 took 285-302 s."""
    return max(2, (os.cpu_count() or 1) * 2)


def _isolate(patch: pytest.MonkeyPatch) -> None:
    """A developer's own QUARRY_* settings must not change what the tests see.

    Internal services run unauthenticated unless a test gives them mesh peers (tests/quarry/test_mesh.py
    and the process meshes do): most tests are about something else. The public API is authenticated
    everywhere, with the test keys above.
    """
    for name in list(os.environ):
        if name.startswith("QUARRY_") and not name.startswith("QUARRY_TEST_"):  # the test settings stay
            patch.delenv(name)
    patch.setenv("QUARRY_MESH_INSECURE", "true")
    patch.setenv("QUARRY_SUPERVISOR_API_KEYS", TEST_API_KEYS)
    patch.setenv("QUARRY_API_KEY", TEST_API_KEY)


@pytest.fixture(autouse=True, scope="session")
def _isolated_session() -> Iterator[None]:
    """The isolation below, for what module fixtures start before any test's own fixtures (shared meshes)."""
    with pytest.MonkeyPatch.context() as patch:
        _isolate(patch)
        yield


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _isolate(monkeypatch)


@pytest.fixture
async def model() -> AsyncIterator[ScriptedModel]:
    """The scripted OpenAI-compatible model server on 127.0.0.1."""
    async with ScriptedModel() as server:
        yield server


@pytest.fixture
async def site() -> AsyncIterator[FixtureWeb]:
    """The fixture web on 127.0.0.1."""
    async with FixtureWeb() as fixture:
        yield fixture


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    """An OTLP/gRPC receiver on 127.0.0.1 and its endpoint (tests/fakes/otlp.py)."""
    with serving_collector() as served:
        yield served


@pytest.fixture(scope="module")
def shared_model() -> Iterator[ScriptedModel]:
    """One scripted model server for a module's tests that share a process mesh; each test scripts it anew
    (`ScriptedModel.forget`)."""
    with served_in_thread(ScriptedModel()) as server:
        yield server


@pytest.fixture(scope="module")
def shared_site() -> Iterator[FixtureWeb]:
    """One fixture web for a module's tests that share a process mesh."""
    with served_in_thread(FixtureWeb()) as fixture:
        yield fixture


def _postgres_conninfo() -> str:
    return make_url(POSTGRES_URL).set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass(frozen=True)
class PostgresSchema:
    url: str
    # Every connection through `url` carries this application_name, so a test can find its own.
    application_name: str


# Why PostgreSQL could not be reached, once known: the next tests fail at once with the same line.
_POSTGRES_PROBLEM: list[str] = []


def _require_postgres() -> None:
    """Fail the test in one line that says what to do, without a traceback, when PostgreSQL is not there."""
    if not _POSTGRES_PROBLEM:
        try:
            with psycopg.connect(_postgres_conninfo(), autocommit=True, connect_timeout=5):
                return
        except psycopg.OperationalError as error:
            reason = (str(error).strip().splitlines() or ["no answer"])[-1].strip()
            _POSTGRES_PROBLEM.append(
                f"PostgreSQL at {make_url(POSTGRES_URL).render_as_string(hide_password=True)} is not reachable "
                f"({reason}): start it and create the database (`createdb test` as postgres), or set "
                "QUARRY_TEST_POSTGRES_URL to one; `-k 'not postgresql'` runs the SQLite half alone"
            )
    pytest.fail(_POSTGRES_PROBLEM[0], pytrace=False)


@contextlib.contextmanager
def postgres_schema() -> Iterator[PostgresSchema]:
    """A URL whose connections use a new, empty PostgreSQL schema, dropped afterwards.

    PostgreSQL must be reachable: a missing database fails the test (in one line saying what to do), it is
    never skipped.
    """
    schema = f"test_{uuid.uuid4().hex[:12]}"
    _require_postgres()
    with psycopg.connect(_postgres_conninfo(), autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}", "application_name": schema})
    try:
        yield PostgresSchema(url.render_as_string(hide_password=False), schema)
    finally:
        with psycopg.connect(_postgres_conninfo(), autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextlib.contextmanager
def empty_database(backend: str, directory: Path) -> Iterator[str]:
    """The URL of a new, empty database: a SQLite file in `directory`, or a new PostgreSQL schema."""
    if backend == "sqlite":
        yield f"sqlite:///{directory / 'test.db'}"
        return
    with postgres_schema() as schema:
        yield schema.url


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database per test: a SQLite file, or a new PostgreSQL schema."""
    with empty_database(request.param, tmp_path) as url:
        yield url


@pytest.fixture(scope="module", params=BACKENDS)
def module_database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One empty database for a module's tests that only read (each module runs on both backends)."""
    with empty_database(request.param, tmp_path_factory.mktemp("database")) as url:
        yield url


def assert_migrations_build_the_schema(
    database_url: str, migrations: Path, version_table: str, metadata: sa.MetaData
) -> None:
    """A service's migrations reach head, build exactly `metadata`, and re-run harmlessly."""
    upgrade_schema(database_url, migrations, version_table)
    upgrade_schema(database_url, migrations, version_table)  # a restart re-runs them
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": version_table})
            assert context.get_current_revision() == ScriptDirectory(str(migrations)).get_current_head()
            assert compare_metadata(context, metadata) == []
            assert set(metadata.tables) | {version_table} <= set(sa.inspect(connection).get_table_names())
    finally:
        engine.dispose()


def reusable_port() -> int:
    """A free port below the kernel's ephemeral range, so no outgoing connection takes it
    while a test restarts a server on it."""
    for _ in range(200):
        port = random.randint(20_000, 32_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


@dataclass
class ServiceProcess:
    """A service started as a real OS process with `quarry serve`."""

    name: str
    address: str
    process: subprocess.Popen[bytes]
    log_path: Path
    # SIGTERM was sent: a second one during the graceful stop would end the process by the signal.
    terminated: bool = False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        """SIGTERM, once: the service stops gracefully (its exit status says whether it did)."""
        if not self.terminated:
            self.terminated = True
            self.process.terminate()


@dataclass
class Launched:
    """A `quarry serve` process started, not yet known to serve."""

    name: str
    process: subprocess.Popen[bytes]
    port_file: Path
    log_path: Path


def launch_service(name: str, env: dict[str, str], workdir: Path, *, port: int = 0) -> Launched:
    """Start `quarry serve NAME`; `ready` waits for it. Launching several before waiting overlaps their startups."""
    port_file = workdir / f"{name}-{uuid.uuid4().hex[:6]}.addr"
    log_path = workdir / f"{name}-{uuid.uuid4().hex[:6]}.log"
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            serve_command(name, port_file, address=f"127.0.0.1:{port}"),
            env={**os.environ, **env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    return Launched(name, process, port_file, log_path)


def ready(launched: Launched, timeout: float = 60.0) -> ServiceProcess:
    """Wait until a launched service has bound its address and reports SERVING; kill it if it does not."""
    process, log_path = launched.process, launched.log_path
    try:
        deadline = time.monotonic() + timeout
        while not launched.port_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{launched.name} did not start:\n{log_path.read_text()}")
            time.sleep(0.05)
        address = launched.port_file.read_text().strip()
        with grpc.insecure_channel(address) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
    except BaseException:
        process.kill()
        process.wait()
        raise
    return ServiceProcess(launched.name, address, process, log_path)


def start_service(
    name: str, env: dict[str, str], workdir: Path, *, port: int = 0, timeout: float = 60.0
) -> ServiceProcess:
    """Start `quarry serve NAME` and wait until it has bound its address and reports SERVING."""
    return ready(launch_service(name, env, workdir, port=port), timeout)


def start_services(services: list[tuple[str, dict[str, str]]], workdir: Path) -> list[ServiceProcess]:
    """Start several services at once (their startups overlap), each serving when this returns.

    When one fails to start, the others are stopped too."""
    launched = [launch_service(name, env, workdir) for name, env in services]
    started: list[ServiceProcess] = []
    try:
        for one in launched:
            started.append(ready(one))
    except BaseException:
        kill_all([one.process for one in launched])
        raise
    return started


def stop_service(service: ServiceProcess, timeout: float = 20.0) -> int | None:
    """SIGTERM (unless sent already) and wait; returns the exit status, or None when it had to be killed."""
    if service.process.poll() is None:
        service.terminate()
    try:
        return service.process.wait(timeout)
    except subprocess.TimeoutExpired:
        service.process.kill()
        service.process.wait()
        return None


def kill_all(processes: list[subprocess.Popen[str]] | list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()
