"""A real OpenSSH server on 127.0.0.1 for the tests: the distribution's sshd, configured in a temporary directory.

It runs in the foreground as this process's child (`sshd -D`) with a generated host key and one authorized
client key, and a known-hosts file naming its key, so the monitor's SSH client (host-key check, key auth,
commands, SFTP) talks to the server a GPU host runs. sshd must be started by root (it switches to the user
who logs in, here root itself); where it cannot be, the tests that need it skip, saying why.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from quarry.config import MonitorSettings, SshHost
from tests.conftest import reusable_port
from tests.hosts import listening, stop, unavailable, wait_until

SSHD = "/usr/sbin/sshd"


@dataclass(frozen=True)
class OpenSshHost:
    port: int
    known_hosts: Path
    client_key: Path
    log: Path
    user: str

    def ssh_host(self, *, log_roots: list[str], workspace_roots: list[str] | None = None) -> SshHost:
        return SshHost(
            address="127.0.0.1",
            port=self.port,
            user=self.user,
            key_path=str(self.client_key),
            known_hosts=str(self.known_hosts),
            log_roots=log_roots,
            workspace_roots=workspace_roots or [],
        )

    def settings(
        self, *, log_roots: list[str], workspace_roots: list[str] | None = None, **overrides: Any
    ) -> MonitorSettings:
        host = self.ssh_host(log_roots=log_roots, workspace_roots=workspace_roots)
        return MonitorSettings(address="127.0.0.1:0", hosts={"gpu1": host}, allow_job_submission=True, **overrides)


@contextlib.contextmanager
def openssh_host(directory: Path, environment: Mapping[str, str] | None = None) -> Iterator[OpenSshHost]:
    """sshd on a free port of 127.0.0.1 until the block ends; `environment` is set in every session."""
    if not Path(SSHD).exists():
        unavailable(f"{SSHD} is missing: install the Debian package openssh-server")
    if os.geteuid() != 0:
        unavailable("sshd is started as root here, and this user is not root")
    directory.mkdir(parents=True, exist_ok=True)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    (directory / "host_key").write_bytes(host_key.export_private_key())
    (directory / "host_key").chmod(0o600)
    (directory / "client_key").write_bytes(client_key.export_private_key())
    (directory / "client_key").chmod(0o600)
    (directory / "authorized_keys").write_bytes(client_key.export_public_key())
    port = reusable_port()
    lines = [
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {directory / 'host_key'}",
        f"PidFile {directory / 'sshd.pid'}",
        f"AuthorizedKeysFile {directory / 'authorized_keys'}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",  # the temporary directory's modes are not a home's
        "Subsystem sftp internal-sftp",
        "MaxStartups 100",
        "MaxSessions 100",
        "LogLevel VERBOSE",
        *(f"SetEnv {name}={value}" for name, value in (environment or {}).items()),
    ]
    config = directory / "sshd_config"
    config.write_text("\n".join(lines) + "\n")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege separation directory
    log = directory / "sshd.log"
    with open(log, "wb") as output:
        process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_until(listening(process, port, log), "sshd", log, 20.0)
        known_hosts = directory / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_key.export_public_key().decode().strip()}\n")
        yield OpenSshHost(port, known_hosts, directory / "client_key", log, user=_user())
    finally:
        stop(process, 10)


def _user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name
