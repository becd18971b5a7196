"""`quarry up` starts each service as its own process, reports them, and stops them all."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.cli.registry import SERVICES
from quarry.v1 import monitor_pb2, scratchpad_pb2, worker_pb2

pytestmark = pytest.mark.slow


class QuarryUp:
    """A `quarry up` process whose output is read on a thread, so waiting on it has a deadline."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "quarry", "up", "--ephemeral-ports", "--data-dir", str(tmp_path / "data")],
            # TMPDIR: its run directory lands in tmp_path even when it is killed before cleaning up.
            env={**os.environ, "QUARRY_LOG_LEVEL": "WARNING", "TMPDIR": str(tmp_path), **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self, deadline: float) -> str | None:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError("quarry up said nothing in time:\n" + "".join(self.output)) from None
        if line is not None:
            self.output.append(line)
        return line

    def addresses(self, services: set[str], timeout: float = 60) -> dict[str, str]:
        found: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while set(found) != services:
            line = self.next_line(deadline)
            assert line is not None, "quarry up ended early:\n" + "".join(self.output)
            if line.startswith("serving "):
                _, name, address = line.split()
                found[name] = address
        return found

    def rest_of_output(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while self.next_line(deadline) is not None:
            pass
        return "".join(self.output)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Callable[..., QuarryUp]]:
    started: list[QuarryUp] = []

    def start(**env: str) -> QuarryUp:
        instance = QuarryUp(tmp_path, **env)
        started.append(instance)
        return instance

    yield start
    for instance in started:
        if instance.process.poll() is None:
            instance.process.kill()
            instance.process.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def child_pids(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the field after the state is the parent pid
            children.append(int(stat.parent.name))
    return children


def wait_gone(pids: list[int], timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_up_serves_every_service_and_stops_them_all(
    up: Callable[..., QuarryUp], tmp_path: Path, stop_signal: signal.Signals
) -> None:
    mesh = up()
    addresses = mesh.addresses(set(SERVICES))
    children = child_pids(mesh.process.pid)
    assert len(children) == len(addresses)
    for address in addresses.values():
        with grpc.insecure_channel(address) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
    assert (tmp_path / "data" / "scratchpad.db").exists()
    mesh.process.send_signal(stop_signal)
    assert mesh.process.wait(30) == 0
    assert wait_gone(children) == [], "a service process outlived quarry up"


def test_up_fails_clearly_when_a_service_cannot_start(up: Callable[..., QuarryUp]) -> None:
    mesh = up(QUARRY_SCRATCHPAD_DATABASE_URL="mysql://nowhere/db")
    output = mesh.rest_of_output()
    assert mesh.process.wait(30) == 1
    assert "scratchpad exited with status" in output
    assert "unsupported database" in output


def test_services_stop_when_quarry_up_is_killed(up: Callable[..., QuarryUp]) -> None:
    mesh = up()
    mesh.addresses(set(SERVICES))
    children = child_pids(mesh.process.pid)
    assert children
    mesh.process.kill()  # no chance to clean up: the kernel's parent-death signal must do it
    mesh.process.wait(10)
    assert wait_gone(children) == [], "a service process outlived a killed quarry up"


def test_up_gives_its_services_mesh_credentials_and_refuses_callers_without_one(
    up: Callable[..., QuarryUp],
) -> None:
    mesh = up(QUARRY_MESH_INSECURE="false")
    addresses = mesh.addresses(set(SERVICES))
    calls = {
        "scratchpad": ("/quarry.v1.ScratchpadService/CreateThread", scratchpad_pb2.CreateThreadRequest(title="x")),
        "worker": ("/quarry.v1.WorkerService/GetDelegation", worker_pb2.GetDelegationRequest(delegation_id="d")),
        "monitor": ("/quarry.v1.MonitorService/ListGpus", monitor_pb2.ListGpusRequest()),
    }
    for name, (method, request) in calls.items():
        with grpc.insecure_channel(addresses[name]) as channel:
            call = channel.unary_unary(method, request_serializer=type(request).SerializeToString)
            with pytest.raises(grpc.RpcError) as raised:
                call(request, timeout=10)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED, name  # type: ignore[attr-defined]
    # The services themselves got their credentials: each child holds its own token, or none.
    environments = {}
    for pid in child_pids(mesh.process.pid):
        variables = dict(
            entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry
        )
        service = Path(f"/proc/{pid}/cmdline").read_text().split("\0")[4]
        environments[service] = variables
    tokens = {name: variables.get("QUARRY_MESH_TOKEN") for name, variables in environments.items()}
    assert tokens["scratchpad"] is None and tokens["monitor"] is None
    assert tokens["supervisor"] and tokens["worker"] and tokens["supervisor"] != tokens["worker"]
    peers = {variables["QUARRY_MESH_PEERS"] for variables in environments.values()}
    assert len(peers) == 1 and tokens["supervisor"] not in peers.pop()
