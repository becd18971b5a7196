"""What the command line says when it cannot do its job: one line that says what to do, never a traceback."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quarry.clients.retry import RetryPolicy
from tests.conftest import reusable_port


def quarry(*args: str, env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run `quarry ARGS` to the end; its status and what it printed (stdout and stderr together)."""
    result = subprocess.run(
        [sys.executable, "-m", "quarry", *args],
        env={**os.environ, "COLUMNS": "400", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return result.returncode, result.stdout


@pytest.mark.parametrize("command", [["ask", "Is anyone there?"], ["runs", "list"], ["runs", "show", "run-1"]])
def test_a_supervisor_that_is_not_running_is_reported_before_any_retrying_would_end(
    command: list[str], tmp_path: Path
) -> None:
    address = f"127.0.0.1:{reusable_port()}"  # nothing listens there
    # Before, each call retried UNAVAILABLE for the whole retry policy, silently.
    code, output = quarry(
        *command, "--address", address, env={"QUARRY_DATA_DIR": str(tmp_path)}, timeout=RetryPolicy().total_seconds
    )
    assert code == 1
    [line] = output.splitlines()
    assert line.startswith(f"quarry: no supervisor answers at {address} (")
    assert "start it with `quarry up`" in line and "QUARRY_SUPERVISOR_ADDRESS" in line


@pytest.mark.parametrize(
    ("command", "variable", "value"),
    [
        (["ask", "Why?"], "QUARRY_SUPERVISOR_MAX_ACTIVE_RUNS", "lots"),
        (["runs", "list"], "QUARRY_SUPERVISOR_ADDRESS", "no-port"),
        (["doctor"], "QUARRY_MONITOR_HOSTS", "not json"),
        (["serve", "monitor", "--address", "127.0.0.1:0"], "QUARRY_MONITOR_HOSTS", "not json"),
        (["serve", "worker", "--address", "127.0.0.1:0"], "QUARRY_WORKER_PAGE_CHUNK_CHARS", "1"),
        (["serve", "scratchpad", "--address", "127.0.0.1:0"], "QUARRY_TLS_CA_FILE", "/nonexistent/ca.pem"),
        (["corpus", "index", "."], "QUARRY_LOG_LEVEL", "verbose"),
    ],
)
def test_a_bad_setting_is_one_line_and_status_2_for_every_command(
    command: list[str], variable: str, value: str, tmp_path: Path
) -> None:
    code, output = quarry(*command, env={"QUARRY_DATA_DIR": str(tmp_path), variable: value})
    assert code == 2, output
    [line] = output.splitlines()
    assert line.startswith("quarry") and variable in line


@pytest.mark.parametrize(
    ("command", "variable", "value"),
    [
        # The worker starts third: before, the scratchpad and the monitor were already up when it failed.
        (["up", "--ephemeral-ports"], "QUARRY_WORKER_SEARCH_BACKEND", "bing"),
        # The supervisor's database is upgraded last: before, the others already were.
        (["migrate"], "QUARRY_SUPERVISOR_ADDRESS", "no-port"),
    ],
)
def test_commands_over_every_service_read_every_setting_before_starting_any(
    command: list[str], variable: str, value: str, tmp_path: Path
) -> None:
    code, output = quarry(*command, env={"QUARRY_DATA_DIR": str(tmp_path), "TMPDIR": str(tmp_path), variable: value})
    assert code == 2, output
    [line] = output.splitlines()
    assert line.startswith("quarry") and variable in line
    assert not list(tmp_path.glob("*.db")), "a database was created or upgraded before the error"


def mapped(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("command", [["up", "--ephemeral-ports"], ["serve", "scratchpad", "--address", "127.0.0.1:0"]])
async def test_ctrl_c_while_the_command_is_still_loading_exits_quietly(command: list[str], tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quarry",
        *command,
        env={**os.environ, "QUARRY_DATA_DIR": str(tmp_path), "TMPDIR": str(tmp_path)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    # pydantic's compiled core loads as the command's modules do, a second or more before it takes charge of
    # Ctrl-C itself: a signal now lands while they load.
    deadline = time.monotonic() + 60
    while not mapped(process.pid, "pydantic_core") and process.returncode is None:
        assert time.monotonic() < deadline, "the command never loaded its settings"
        await asyncio.sleep(0.005)
    process.send_signal(signal.SIGINT)
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode in (0, 130), output.decode()
    assert "Traceback" not in output.decode() and "KeyboardInterrupt" not in output.decode()
