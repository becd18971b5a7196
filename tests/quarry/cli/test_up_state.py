"""Where the client commands find a running `quarry up`: the state file it writes, and the order of precedence."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from quarry.cli.commands import service_addresses
from quarry.cli.up_state import STATE_FILE, UpState
from quarry.config import QuarrySettings


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def state(pid: int) -> UpState:
    services = {"supervisor": ["127.0.0.1:5001"], "worker": ["127.0.0.1:5002", "127.0.0.1:5003"]}
    return UpState(pid, services, {"supervisor": 11, "worker-1": 12, "worker-2": 13})


def test_the_state_file_reads_back_only_while_its_up_is_alive(tmp_path: Path) -> None:
    state(os.getpid()).write(tmp_path)
    assert UpState.read(tmp_path) == state(os.getpid())
    assert "token" not in (tmp_path / STATE_FILE).read_text().lower()
    UpState.remove(tmp_path, os.getpid() + 1)  # not that up's file: left alone
    assert (tmp_path / STATE_FILE).exists()
    UpState.remove(tmp_path, os.getpid())
    assert not (tmp_path / STATE_FILE).exists()
    state(dead_pid()).write(tmp_path)  # left behind by a killed up
    assert UpState.read(tmp_path) is None
    (tmp_path / STATE_FILE).write_text("{not json")
    assert UpState.read(tmp_path) is None


def test_client_commands_take_the_flag_then_the_environment_then_the_state_file_then_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = QuarrySettings(data_dir=tmp_path)
    assert service_addresses("supervisor", common) == ["127.0.0.1:7410"]
    assert service_addresses("worker", common) == ["127.0.0.1:7412"]
    state(os.getpid()).write(tmp_path)
    assert service_addresses("supervisor", common) == ["127.0.0.1:5001"]
    assert service_addresses("worker", common) == ["127.0.0.1:5002", "127.0.0.1:5003"]
    assert service_addresses("scratchpad", common) == ["127.0.0.1:7411"], "a service the file does not name"
    monkeypatch.setenv("QUARRY_SUPERVISOR_ADDRESS", "10.0.0.1:7410")
    monkeypatch.setenv("QUARRY_SUPERVISOR_WORKER_ADDRESSES", "10.0.0.2:7412")
    assert service_addresses("supervisor", common) == ["10.0.0.1:7410"]
    assert service_addresses("worker", common) == ["10.0.0.2:7412"]
    assert service_addresses("supervisor", common, "10.0.0.9:1") == ["10.0.0.9:1"]
