"""Fixtures shared by every test: databases (SQLite and the real PostgreSQL) and processes."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from quarry.launcher import serve_command

POSTGRES_URL = os.environ.get("QUARRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgresql"]


def _postgres_conninfo() -> str:
    return make_url(POSTGRES_URL).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.contextmanager
def postgres_schema_url() -> Iterator[str]:
    """A URL whose connections use a new, empty PostgreSQL schema, dropped afterwards.

    PostgreSQL must be reachable: a missing database fails the test, it is never skipped.
    """
    schema = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_postgres_conninfo(), autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with psycopg.connect(_postgres_conninfo(), autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database per test: a SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    with postgres_schema_url() as url:
        yield url


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServiceProcess:
    """A service started as a real OS process with `quarry serve`."""

    name: str
    address: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_service(
    name: str, env: dict[str, str], workdir: Path, *, port: int = 0, timeout: float = 60.0
) -> ServiceProcess:
    """Start `quarry serve NAME` and wait until it has bound its address and reports SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    port_file = workdir / f"{name}-{uuid.uuid4().hex[:6]}.addr"
    log_path = workdir / f"{name}.log"
    log_file = log_path.open("ab")
    process = subprocess.Popen(
        serve_command(name, port_file, address=f"127.0.0.1:{port}"),
        env={**os.environ, **env},
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    log_file.close()
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"{name} did not start:\n{log_path.read_text()}")
        time.sleep(0.05)
    address = port_file.read_text().strip()
    with grpc.insecure_channel(address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    return ServiceProcess(name, address, process, log_path)


def stop_service(service: ServiceProcess, timeout: float = 20.0) -> int:
    if service.process.poll() is None:
        service.process.terminate()
    return service.process.wait(timeout)
