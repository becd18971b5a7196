"""`quarry up` starts each service as its own process, reports them, and stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

pytestmark = pytest.mark.slow


def start_up(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "quarry", "up", "--ephemeral-ports", "--data-dir", str(tmp_path / "data")],
        env={**os.environ, "QUARRY_LOG_LEVEL": "WARNING", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_addresses(process: subprocess.Popen[str], services: set[str], timeout: float = 60) -> dict[str, str]:
    assert process.stdout is not None
    addresses: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    output = []
    while set(addresses) != services:
        assert time.monotonic() < deadline, "".join(output)
        line = process.stdout.readline()
        assert line, "quarry up ended early:\n" + "".join(output)
        output.append(line)
        if line.startswith("serving "):
            _, name, address = line.split()
            addresses[name] = address
    return addresses


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(line) for line in out.split()]


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_up_serves_every_service_and_stops_them_all(tmp_path: Path, stop_signal: signal.Signals) -> None:
    process = start_up(tmp_path)
    try:
        addresses = wait_for_addresses(process, {"scratchpad"})
        children = child_pids(process.pid)
        assert len(children) == len(addresses)
        for address in addresses.values():
            with grpc.insecure_channel(address) as channel:
                response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert response.status == health_pb2.HealthCheckResponse.SERVING
        assert (tmp_path / "data" / "scratchpad.db").exists()
        process.send_signal(stop_signal)
        assert process.wait(30) == 0
        for pid in children:
            for _ in range(100):
                if not alive(pid):
                    break
                time.sleep(0.05)
            assert not alive(pid), f"service process {pid} outlived quarry up"
    finally:
        if process.poll() is None:
            process.kill()


def test_up_fails_clearly_when_a_service_cannot_start(tmp_path: Path) -> None:
    process = start_up(tmp_path, QUARRY_SCRATCHPAD_DATABASE_URL="mysql://nowhere/db")
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "scratchpad exited with status" in stdout
    assert "unsupported database" in stdout


def test_services_stop_when_quarry_up_is_killed(tmp_path: Path) -> None:
    process = start_up(tmp_path)
    try:
        wait_for_addresses(process, {"scratchpad"})
        children = child_pids(process.pid)
        assert children
        process.kill()  # no chance to clean up: the kernel's parent-death signal must do it
        process.wait(10)
        for pid in children:
            for _ in range(400):
                if not alive(pid):
                    break
                time.sleep(0.05)
            assert not alive(pid), f"service process {pid} outlived a killed quarry up"
    finally:
        if process.poll() is None:
            process.kill()
