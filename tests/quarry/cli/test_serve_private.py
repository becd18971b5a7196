"""A service keeps its secrets from the other processes of its user: it is not dumpable, so no one
without CAP_SYS_PTRACE reads its /proc/PID/environ, and what it writes is its user's alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from stat import S_IMODE

import pytest

from quarry.cli.launcher import serve_command
from tests.conftest import Launched, ready

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not shutil.which("setpriv"), reason="Linux's /proc and util-linux's setpriv"
)

# Run as root, a process has CAP_SYS_PTRACE and reads any environ: the service, the control and the reader
# run without any capability, as the service's user's other processes do.
UNPRIVILEGED = ["setpriv", "--bounding-set=-all", "--no-new-privs"] if os.geteuid() == 0 else []
SECRET = "model-key-no-one-else-reads"


def read_environ(pid: int) -> subprocess.CompletedProcess[str]:
    """Another process of the same user (neither the target's parent nor its child) reading its environ."""
    reader = f"print(open('/proc/{pid}/environ', 'rb').read().count(b'{SECRET}'))"
    return subprocess.run(
        [*UNPRIVILEGED, sys.executable, "-c", reader], capture_output=True, text=True, timeout=30, check=False
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_no_other_process_of_its_user_reads_a_services_environment(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    env = {
        **os.environ,
        "QUARRY_MODEL_API_KEY": SECRET,
        "QUARRY_DATA_DIR": str(tmp_path / "data"),
        "QUARRY_MESH_INSECURE": "true",
    }
    port_file, log_path = tmp_path / "scratchpad.addr", tmp_path / "scratchpad.log"
    with log_path.open("ab") as log:
        service = subprocess.Popen(
            [*UNPRIVILEGED, *serve_command("scratchpad", port_file, address="127.0.0.1:0")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    processes.append(service)
    # The control: a process of the same user and the same secret that did not opt out is readable.
    control = subprocess.Popen([*UNPRIVILEGED, "sleep", "60"], env=env)
    processes.append(control)
    ready(Launched("scratchpad", service, port_file, log_path))

    readable = read_environ(control.pid)
    assert readable.returncode == 0 and readable.stdout.strip() == "1", readable.stderr
    refused = read_environ(service.pid)
    assert refused.returncode == 1 and "PermissionError" in refused.stderr, refused.stdout
    # Its umask: the database it created is its user's alone, in a directory only its user enters.
    assert S_IMODE((tmp_path / "data" / "scratchpad.db").stat().st_mode) == 0o600
    assert S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
