"""A real asyncssh server on 127.0.0.1 for the monitor's SSH tests, with fake Slurm and nvidia-smi tools.

Commands it is asked to run execute with a PATH whose `nvidia-smi`, `sbatch`, `squeue` and `sacct`
are scripts printing recorded output from files the test controls; SFTP serves this machine's
files. So the monitor's real client code (host-key check, key auth, connection reuse, output
parsing, SFTP) runs end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
import grpc

from monitor_svc.service import build_host
from quarry.clients.channels import insecure_channel
from quarry.config import MonitorSettings, QuarrySettings, SshHost
from quarry.v1 import monitor_pb2_grpc

GPUS_CSV = "0, GPU-aaaa, NVIDIA H200, 1024, 143771, 87, 61, 312.50\n1, GPU-bbbb, NVIDIA H200, 0, 143771, 0, 35, [N/A]\n"
APPS_CSV = "GPU-aaaa, 4242, 1024, python\n"
FAKES = {
    "nvidia-smi": 'case "$1" in --query-gpu=*) cat "$FAKE_STATE/gpus.csv";; *) cat "$FAKE_STATE/apps.csv";; esac\n',
    "sbatch": 'echo "$@" > "$FAKE_STATE/sbatch.args"; echo "4242;cluster"\n',
    "sacct": 'cat "$FAKE_STATE/sacct.txt" 2>/dev/null; exit 0\n',
    "squeue": 'cat "$FAKE_STATE/squeue.txt" 2>/dev/null; exit 0\n',
}

# A fake Slurm that runs what it is given: sbatch starts the script in the background (in --chdir, its output
# to --output) and logs its arguments to batch.log; sacct says RUNNING until the script's exit status is there.
RUNNING_SLURM = {
    "sbatch": """echo "$@" >> "$FAKE_STATE/batch.log"
output=/dev/null; directory=.
for arg in "$@"; do
  case "$arg" in --output=*) output="${arg#--output=}";; --chdir=*) directory="${arg#--chdir=}";; esac
  script="$arg"
done
id=$(( $(cat "$FAKE_STATE/batch.last" 2>/dev/null || echo 100) + 1 )); echo "$id" > "$FAKE_STATE/batch.last"
(cd "$directory" && sh "$script" > "$output" 2>&1; echo $? > "$FAKE_STATE/$id.exit.tmp"
 mv "$FAKE_STATE/$id.exit.tmp" "$FAKE_STATE/$id.exit") < /dev/null > /dev/null 2>&1 &
echo "$id"
""",
    "sacct": """id="$2"
if [ -f "$FAKE_STATE/$id.exit" ]; then
  code=$(cat "$FAKE_STATE/$id.exit")
  if [ "$code" = 0 ]; then echo "$id|COMPLETED|0:0|01:00:00"; else echo "$id|FAILED|$code:0|01:00:00"; fi
else
  echo "$id|RUNNING|0:0|01:00:00"
fi
""",
}


@dataclass
class FakeHost:
    port: int
    state: Path
    known_hosts: Path
    client_key: Path
    connections: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)  # every command it was asked to run, in order

    def write(self, name: str, text: str) -> None:
        (self.state / name).write_text(text)

    def run_batch_jobs(self) -> None:
        """Make the fake Slurm run the batch scripts it is given (RUNNING_SLURM)."""
        for name, body in RUNNING_SLURM.items():
            (self.state.parent / "fakebin" / name).write_text("#!/bin/sh\n" + body)

    def batch_submissions(self) -> list[list[str]]:
        """The arguments of each sbatch the running fake Slurm was given."""
        log = self.state / "batch.log"
        return [line.split() for line in log.read_text().splitlines()] if log.exists() else []

    def settings(self, *, workspace_roots: list[str] | None = None, **overrides: Any) -> MonitorSettings:
        host = SshHost(
            address="127.0.0.1",
            port=self.port,
            user="quarry",
            key_path=str(self.client_key),
            known_hosts=str(self.known_hosts),
            log_roots=[str(self.state.parent / "logs")],
            workspace_roots=workspace_roots or [],
        )
        return MonitorSettings(address="127.0.0.1:0", hosts={"gpu1": host}, allow_job_submission=True, **overrides)


@contextlib.asynccontextmanager
async def fake_ssh_host(tmp_path: Path) -> AsyncIterator[FakeHost]:
    bin_dir, state = tmp_path / "fakebin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in FAKES.items():
        script = bin_dir / name
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(0o755)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = tmp_path / "id_ed25519"
    client_key.write_private_key(str(key_path))
    fake: FakeHost | None = None

    class Server(asyncssh.SSHServer):
        def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
            assert fake is not None
            fake.connections.append(str(conn.get_extra_info("peername")))

        def connection_lost(self, exc: Exception | None) -> None:
            assert fake is not None
            fake.closed.append("closed")

    async def run_command(process: asyncssh.SSHServerProcess[str]) -> None:
        assert fake is not None
        fake.commands.append(process.command or "")
        command = await asyncio.create_subprocess_shell(
            process.command or "true",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_STATE": str(state)},
        )
        out, err = await command.communicate()
        process.stdout.write(out.decode())
        process.stderr.write(err.decode())
        process.exit(command.returncode or 0)

    server = await asyncssh.create_server(
        Server,
        "127.0.0.1",
        0,
        server_host_keys=[host_key],
        authorized_client_keys=asyncssh.import_authorized_keys(client_key.export_public_key().decode()),
        process_factory=run_command,
        sftp_factory=True,  # this machine's files, as the test's own user
    )
    port = server.sockets[0].getsockname()[1]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key.export_public_key().decode().strip()}\n")
    fake = FakeHost(port, state, known_hosts, key_path)
    fake.write("gpus.csv", GPUS_CSV)
    fake.write("apps.csv", APPS_CSV)
    try:
        yield fake
    finally:
        server.close()
        await server.wait_closed()


async def monitor_for(
    settings: MonitorSettings, tmp_path: Path
) -> tuple[Any, grpc.aio.Channel, monitor_pb2_grpc.MonitorServiceStub]:
    host = await build_host(settings, QuarrySettings(data_dir=tmp_path))
    await host.start()
    channel = insecure_channel(host.address)
    return host, channel, monitor_pb2_grpc.MonitorServiceStub(channel)
