"""Real servers the tests start from the distribution's packages: OpenSSH (openssh.py) and Slurm (slurm.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

# Set in .ci/run: there the system services must be there, so a missing one fails instead of skipping.
REQUIRED = os.environ.get("QUARRY_TEST_SYSTEM_SERVICES", "") == "required"


def unavailable(reason: str) -> None:
    """Skip the test (one line saying why), or fail it where the system services are required."""
    if REQUIRED:
        pytest.fail(f"{reason} (QUARRY_TEST_SYSTEM_SERVICES=required)")
    pytest.skip(reason)


def which(name: str) -> str | None:
    """The program on the system's own PATH (the sbin directories too), or None."""
    return shutil.which(name, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def wait_until(ready: Callable[[], bool], what: str, log: Path, timeout: float = 60.0) -> None:
    """Poll `ready` until it holds; RuntimeError with the end of `log` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} was not ready within {timeout} s: {tail(log)}")


def tail(log: Path) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    except FileNotFoundError:
        return "(no log)"


def listening(process: subprocess.Popen[bytes], port: int, log: Path) -> Callable[[], bool]:
    """Whether the daemon accepts connections on 127.0.0.1:`port`; RuntimeError once it has exited."""

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with status {process.returncode}: {tail(log)}")
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    return ready


def stop(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
