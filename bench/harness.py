"""What the benchmarks share: their command line, starting services as processes, and reading figures."""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from quarry.api_auth import ALL_ROLES, new_api_key, static_key_entry
from quarry.cli.launcher import serve_command
from quarry.identity import MeshRole
from quarry.mesh_auth import MeshKeys

# The benchmarks drive the mesh with the tests' fakes (scripted model, fixture web, process mesh).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def arguments(doc: str, **defaults: float | str) -> argparse.Namespace:
    """The benchmark's command line: its docstring as help and one --option per default, typed like the default."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    return parser.parse_args()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# Every benchmark's services authenticate each other with mesh tokens, as a deployment does. The
# tokens derive from one secret in the environment, so client processes the benchmark spawns share them.
_SECRET = os.environ.setdefault("QUARRY_BENCH_MESH_SECRET", secrets.token_hex(16))
MESH = MeshKeys({role: hashlib.sha256(f"{_SECRET}/{role.value}".encode()).hexdigest() for role in MeshRole})


# The public API's key, likewise: the supervisors the benchmarks start accept it, their clients send it.
API_KEY = os.environ.setdefault("QUARRY_API_KEY", new_api_key())
os.environ.setdefault("QUARRY_SUPERVISOR_API_KEYS", static_key_entry("bench", ALL_ROLES, API_KEY))


def mesh_environment(role: MeshRole | None) -> dict[str, str]:
    """The mesh settings of a service that calls others as `role` (None: one that calls no one)."""
    return MESH.environment(role)


def mesh_token(role: MeshRole) -> str:
    """The token the benchmark presents when it calls a service as `role`."""
    return MESH.tokens[role]


@contextmanager
def running_service(name: str, env: dict[str, str], workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`quarry serve NAME` on a free port: the process and its address once bound; SIGTERM on the way out."""
    workdir.mkdir(parents=True, exist_ok=True)
    port_file = workdir / f"{name}.addr"
    process = subprocess.Popen(serve_command(name, port_file, address="127.0.0.1:0"), env={**os.environ, **env})
    for _ in range(600):
        if port_file.exists() or process.poll() is not None:
            break
        time.sleep(0.05)
    if not port_file.exists():
        process.kill()
        raise RuntimeError(f"{name} did not start")
    try:
        yield process, port_file.read_text().strip()
    finally:
        process.terminate()
        process.wait(30)


POSTGRES_URL = os.environ.get("QUARRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@contextmanager
def postgres_schema(url: str) -> Iterator[str]:
    """A fresh schema in the PostgreSQL database at `url`: the URL of a service using it; dropped on the way out."""
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield (
            make_url(url)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with psycopg.connect(conninfo, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')
