"""A real single-node Slurm cluster for the tests, from the distribution's packages, configured in a temp directory.

munged (the default socket, which Slurm's clients and slurmdbd always use), slurmdbd on the MariaDB this
machine runs (sacct is the monitor's authority on a job, and sacct needs accounting), slurmctld and one slurmd,
all as this process's children in the foreground, on free ports, logging into the directory. Jobs run as root
on this machine. One cluster at a time on a machine (a lock file), since munged's socket is shared; each has
a database of its own, dropped afterwards. Where the packages or root are missing, the tests skip, saying why.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import reusable_port
from tests.hosts import listening, stop, unavailable, wait_until, which

PROGRAMS = ("munged", "mungekey", "munge", "slurmdbd", "slurmctld", "slurmd", "sbatch", "sacct", "scancel", "mariadb")
PACKAGES = "munge slurmdbd slurmctld slurmd slurm-client mariadb-client"
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
_LOCK = Path("/tmp/quarry-test-slurm.lock")
_DATABASE_USER, _DATABASE_PASSWORD = "quarry_slurm_test", "quarry-slurm-test"
NODE = "quarrynode"


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path
    directory: Path

    @property
    def environment(self) -> dict[str, str]:
        """What a client (sbatch, sacct, scancel) needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        """A Slurm client command against this cluster; its output."""
        done = subprocess.run(
            argv, env={**os.environ, **self.environment}, capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout


@contextlib.contextmanager
def slurm_cluster(directory: Path) -> Iterator[SlurmCluster]:
    missing = [name for name in PROGRAMS if which(name) is None]
    if missing:
        unavailable(f"Slurm is not installed ({', '.join(missing)} missing): install the Debian packages {PACKAGES}")
    if os.geteuid() != 0:
        unavailable("the Slurm daemons are started as root here, and this user is not root")
    directory.mkdir(parents=True, exist_ok=True)
    with open(_LOCK, "w") as lock, contextlib.ExitStack() as stack:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one cluster at a time: munged's socket is the machine's
        stack.enter_context(_munged(directory))
        database = stack.enter_context(_database())
        ports = {name: reusable_port() for name in ("slurmctld", "slurmd", "slurmdbd")}
        conf = _write_configuration(directory, ports, database)
        environment = {**os.environ, "SLURM_CONF": str(conf)}
        stack.enter_context(_daemon(["slurmdbd", "-D"], environment, directory / "slurmdbd.log", ports["slurmdbd"]))
        stack.enter_context(_daemon(["slurmctld", "-D"], environment, directory / "slurmctld.log", ports["slurmctld"]))
        stack.enter_context(
            _daemon(["slurmd", "-D", "-N", NODE], environment, directory / "slurmd.log", ports["slurmd"])
        )
        cluster = SlurmCluster(conf, directory)
        _wait_until_idle(cluster)
        yield cluster


def _write_configuration(directory: Path, ports: dict[str, int], database: str) -> Path:
    for name in ("state", "spool"):
        (directory / name).mkdir(exist_ok=True)
    conf = directory / "slurm.conf"
    lines = [
        "ClusterName=quarrytest",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ports['slurmctld']}",
        f"SlurmdPort={ports['slurmd']}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        f"StateSaveLocation={directory / 'state'}",
        f"SlurmdSpoolDir={directory / 'spool'}",
        f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
        f"SlurmdPidFile={directory / 'slurmd.pid'}",
        f"SlurmctldLogFile={directory / 'slurmctld.log'}",
        f"SlurmdLogFile={directory / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",  # no cgroups in a container
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=localhost",
        f"AccountingStoragePort={ports['slurmdbd']}",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",  # the node's CPUs as written here, whatever this machine has
        "ReturnToService=2",
        "InactiveLimit=0",
        "KillWait=2",
        "OverTimeLimit=0",
        "MinJobAge=600",
        f"NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={socket.gethostname()} CPUs=16 State=UNKNOWN",
        f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
    ]
    conf.write_text("\n".join(lines) + "\n")
    dbd = directory / "slurmdbd.conf"  # beside slurm.conf, where slurmdbd looks for it
    dbd.write_text(
        "\n".join(
            [
                "AuthType=auth/munge",
                "DbdHost=localhost",
                "DbdAddr=127.0.0.1",
                f"DbdPort={ports['slurmdbd']}",
                "SlurmUser=root",
                f"LogFile={directory / 'slurmdbd.log'}",
                f"PidFile={directory / 'slurmdbd.pid'}",
                "StorageType=accounting_storage/mysql",
                "StorageHost=localhost",
                f"StorageUser={_DATABASE_USER}",
                f"StoragePass={_DATABASE_PASSWORD}",
                f"StorageLoc={database}",
            ]
        )
        + "\n"
    )
    dbd.chmod(0o600)  # slurmdbd refuses a readable one: it holds the password
    return conf


@contextlib.contextmanager
def _munged(directory: Path) -> Iterator[None]:
    """munged on the default socket, unless one already answers there (a machine's own)."""
    if _munge_answers():
        yield
        return
    key = directory / "munge.key"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    key.chmod(0o600)
    MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
    pid_file = directory / "munged.pid"
    subprocess.run(
        [
            "munged",
            "--force",  # as root
            f"--key-file={key}",
            f"--pid-file={pid_file}",
            f"--log-file={directory / 'munged.log'}",
            f"--seed-file={directory / 'munge.seed'}",
        ],
        check=True,
        capture_output=True,
    )
    try:
        wait_until(_munge_answers, "munged", directory / "munged.log")
        yield
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int(pid_file.read_text().strip())
            os.kill(pid, 15)
            wait_until(lambda: not _running(pid), "munged to stop", directory / "munged.log", 10)


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie no one reaps, as in a container without an init, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _munge_answers() -> bool:
    if not MUNGE_SOCKET.exists():
        return False
    encoded = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
    if encoded.returncode != 0:
        return False
    return subprocess.run(["unmunge"], input=encoded.stdout, capture_output=True, timeout=10).returncode == 0


@contextlib.contextmanager
def _database() -> Iterator[str]:
    """A database of its own on this machine's MariaDB (as root, through its socket), dropped afterwards."""
    name = f"quarry_slurm_{uuid.uuid4().hex[:12]}"
    statements = (
        f"CREATE DATABASE {name}; "
        f"CREATE USER IF NOT EXISTS '{_DATABASE_USER}'@'localhost' IDENTIFIED BY '{_DATABASE_PASSWORD}'; "
        f"GRANT ALL ON {name}.* TO '{_DATABASE_USER}'@'localhost';"
    )
    created = subprocess.run(["mariadb", "-uroot", "-e", statements], capture_output=True, text=True, timeout=30)
    if created.returncode != 0:
        unavailable(f"cannot make slurmdbd's database on this machine's MariaDB: {created.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["mariadb", "-uroot", "-e", f"DROP DATABASE IF EXISTS {name}"], capture_output=True, timeout=30)


@contextlib.contextmanager
def _daemon(argv: list[str], environment: dict[str, str], log: Path, port: int) -> Iterator[None]:
    with open(log.with_suffix(".out"), "wb") as output:
        process = subprocess.Popen(argv, env=environment, stdout=output, stderr=subprocess.STDOUT)

    try:
        wait_until(listening(process, port, log), argv[0], log)
        yield
    finally:
        stop(process, 15)


def _wait_until_idle(cluster: SlurmCluster) -> None:
    def idle() -> bool:
        states = subprocess.run(
            ["sinfo", "--noheader", "--format=%T"], env={**os.environ, **cluster.environment}, capture_output=True,
            text=True, timeout=10,
        )  # fmt: skip
        if states.stdout.strip() != "idle":
            return False
        # Registered with slurmdbd too: otherwise sacct would not know the first jobs.
        clusters = subprocess.run(
            ["sacctmgr", "--noheader", "--parsable2", "show", "cluster", "format=cluster,controlport"],
            env={**os.environ, **cluster.environment}, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return any(line.split("|")[1:2] not in ([], ["0"], [""]) for line in clusters.stdout.splitlines())

    wait_until(idle, "the Slurm node", cluster.directory / "slurmctld.log")
