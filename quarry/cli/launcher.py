"""`quarry up`: every service as its own OS process, supervised until Ctrl-C or SIGTERM.

A service that dies is restarted on the address it had (its peers hold that address), with the
mesh credentials it had, after a backoff that doubles with each exit, at most so many times within
a window; the other services keep running. On stop, services stop in dependency order, each stage
within the grace period: the supervisor first, then the workers, then what they call.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import signal
import socket
import stat
import sys
import tempfile
from collections import deque
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.cli.announcer import Announcer, ServiceRow, describe_exit
from quarry.cli.environment import service_environment
from quarry.cli.registry import ServiceSpec
from quarry.cli.restarts import RestartPolicy
from quarry.cli.up_state import UpState
from quarry.clients.channels import open_channel
from quarry.config import QuarrySettings
from quarry.mesh_auth import MeshKeys
from quarry.security import Tls

READY_POLL_SECONDS = 0.1
LOCK_FILE = "up.lock"


class LaunchError(RuntimeError):
    pass


def serve_command(
    name: str, port_file: Path, *, address: str | None = None, parent_pid: int | None = None
) -> list[str]:
    """The command line that runs one service in its own process and reports its bound address."""
    command = [sys.executable, "-m", "quarry", "serve", name, "--port-file", str(port_file)]
    if address:
        command += ["--address", address]
    if parent_pid:
        command += ["--parent-pid", str(parent_pid)]
    return command


@dataclass(frozen=True)
class Instance:
    """One process `quarry up` runs: a service, the name it is shown by, and its own settings."""

    name: str
    spec: ServiceSpec
    # Set on top of what the service gets of `quarry up`'s environment.
    env: dict[str, str] = field(default_factory=dict)
    # Where it listens; None: its own setting.
    address: str | None = None


def plan(
    specs: Sequence[ServiceSpec], *, workers: int = 1, data_dir: Path, ephemeral_ports: bool = False
) -> list[Instance]:
    """The processes of a `quarry up`, in start order: each service once, the worker `workers` times.

    Workers are named (and identify themselves as) worker-1..N. Worker-1 listens where the worker is
    configured to; the others on free ports of the same host. They share the worker's database (the
    usual SQLite file unless one is configured), as a deployment's replicas do, so that a delegation
    whose worker died goes on on another from its recorded conversation.
    """
    instances = []
    for spec in specs:
        address = "127.0.0.1:0" if ephemeral_ports else None
        if spec.name != "worker":
            instances.append(Instance(spec.name, spec, address=address))
            continue
        prefix = spec.settings_type().model_config.get("env_prefix", "")
        settings = spec.load_settings(**({"address": address} if address else {}))
        for number in range(1, workers + 1):
            env = {f"{prefix}ID": f"worker-{number}"}
            own_address = address or (None if number == 1 else f"{settings.address.rpartition(':')[0]}:0")
            instances.append(Instance(f"worker-{number}", spec, env, own_address))
    return instances


@dataclass
class Child:
    """A running instance: its current process and its history."""

    instance: Instance
    port_file: Path
    env: dict[str, str]
    # The address asked for at first; once serving, the one it bound, which every restart reuses.
    address: str | None
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    # loop.time() of its recent exits, within the restart window.
    exits: deque[float] = field(default_factory=deque)

    @property
    def name(self) -> str:
        return self.instance.name

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else 0

    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


def private_data_dir(data_dir: Path) -> str | None:
    """Make the data directory its owner's alone (0700): its databases hold the research, its logs what
    the services did. A warning when an existing one was open to others; None when nothing changed."""
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = stat.S_IMODE(data_dir.stat().st_mode)
        if not mode & 0o077:
            return None
        data_dir.chmod(0o700)
    except OSError as error:
        raise LaunchError(f"cannot make the data directory {data_dir} private (0700): {error.strerror}") from error
    return f"the data directory {data_dir} was open to other users (mode {mode:04o}); it is 0700 now"


@contextlib.contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Hold the data directory for this `quarry up`: a second one on it would share its SQLite files."""
    path = data_dir / LOCK_FILE
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(descriptor, 0o600)  # one an older release left open to others
    with open(descriptor, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise LaunchError(
                f"another quarry up (pid {holder}) is running on {data_dir}; stop it first, or give this one "
                "its own --data-dir"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield  # the lock goes with the file's closing, or with the process


def port_taken(address: str | None) -> bool:
    """Whether something else listens on the address's port (a child that could not bind it), by trying to bind it."""
    host, _, port = (address or "").rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return False
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host.strip("[]") or "0.0.0.0", int(port)))
        except OSError:
            return True
    return False


def _exited_while_starting(child: Child, returncode: int) -> LaunchError:
    """Why the child is gone before serving: a taken port said as such, with what to do."""
    address = child.address or child.instance.spec.load_settings().address  # its settings' when none was given
    if port_taken(address):
        return LaunchError(
            f"{child.name} could not listen on {address}: the port is in use (another program, or another "
            "quarry up); stop that, set another address, or run `quarry up --ephemeral-ports`"
        )
    return LaunchError(f"{child.name} {describe_exit(returncode)} while starting")


async def _wait_ready(child: Child, deadline: float) -> str:
    """Wait for the child to write its bound address, then for health to say SERVING; its address."""
    loop = asyncio.get_running_loop()
    process = child.process
    assert process is not None
    while not child.port_file.exists():
        if process.returncode is not None:
            raise _exited_while_starting(child, process.returncode)
        if loop.time() > deadline:
            raise LaunchError(f"{child.name} did not bind an address in time")
        await asyncio.sleep(READY_POLL_SECONDS)
    address = child.port_file.read_text().strip()
    # The services' own TLS settings (the environment they inherit), so the check speaks their protocol.
    async with open_channel(address, tls=Tls.from_settings(QuarrySettings())) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.returncode is not None:
                raise _exited_while_starting(child, process.returncode)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise LaunchError(f"{child.name} did not report SERVING in time")
            with contextlib.suppress(grpc.aio.AioRpcError):
                response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=min(remaining, 2.0))
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return address
            await asyncio.sleep(READY_POLL_SECONDS)


def start_stages(instances: Sequence[Instance]) -> list[list[Instance]]:
    """The instances in the order they start, several at once: a service once every service it calls serves."""
    specs = {instance.spec.name: instance.spec for instance in instances}

    @functools.cache
    def depth(name: str) -> int:  # the longest chain of services below it
        return max((depth(needed) + 1 for needed in specs[name].needs if needed in specs), default=0)

    stages: dict[int, list[Instance]] = {}
    for instance in instances:
        stages.setdefault(depth(instance.spec.name), []).append(instance)
    return [stages[level] for level in sorted(stages)]


def stop_stages(children: Sequence[Child]) -> list[list[Child]]:
    """The children in the order they stop: a service once every service that calls it has stopped."""
    specs = {child.instance.spec.name: child.instance.spec for child in children}

    @functools.cache
    def depth(name: str) -> int:  # the longest chain of callers above it
        return max((depth(caller.name) + 1 for caller in specs.values() if name in caller.needs), default=0)

    stages: dict[int, list[Child]] = {}
    for child in children:
        stages.setdefault(depth(child.instance.spec.name), []).append(child)
    return [stages[level] for level in sorted(stages)]


async def _stop_requested_first(tasks: Collection[asyncio.Task[Any]], stop_requested: asyncio.Event) -> bool:
    """Wait until one of `tasks` ends or a stop is requested; True for a stop. The tasks are left running."""
    stopping = asyncio.create_task(stop_requested.wait())
    await asyncio.wait({*tasks, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    return stop_requested.is_set()


class ProcessGroup:
    """The children of one `quarry up`: started in order, restarted when they die, stopped in order."""

    def __init__(
        self,
        run_dir: Path,
        data_dir: Path,
        *,
        ready_timeout: float,
        policy: RestartPolicy,
        announce: Announcer,
        service_env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self._run_dir = run_dir
        self._data_dir = data_dir
        self._ready_timeout = ready_timeout
        self._policy = policy
        self._announce = announce
        # Per service, set last (over the addresses of what it needs): the supervisor's API keys.
        self._service_env = dict(service_env or {})
        # Fresh for every `quarry up`: the services it starts trust each other, and no one else. A restarted
        # service gets the credentials it had, which its peers know. QUARRY_MESH_INSECURE=true (a machine
        # one person uses, debugging by hand) runs them unauthenticated.
        self._keys = None if QuarrySettings().mesh_insecure else MeshKeys.generate()
        self.children: list[Child] = []

    def rows(self) -> list[ServiceRow]:
        return [ServiceRow(c.name, c.address or "", c.pid, c.restarts) for c in self.children]

    def publish(self) -> None:
        """Tell the other commands where the services are (the state file in the data directory)."""
        services: dict[str, list[str]] = {}
        for child in self.children:
            services.setdefault(child.instance.spec.name, []).append(child.address or "")
        UpState(os.getpid(), services, {child.name: child.pid for child in self.children}).write(self._data_dir)

    def unpublish(self) -> None:
        UpState.remove(self._data_dir, os.getpid())

    def _environment(self, instance: Instance) -> dict[str, str]:
        # Only what the service reads: another's settings and the credentials it does not use stay here.
        env = service_environment(os.environ, instance.spec, self._data_dir)
        # Each child gets its own mesh token (none for a service that calls no other) and every peer's digest.
        if self._keys is not None:
            env.pop("QUARRY_MESH_TOKEN", None)
            env.pop("QUARRY_MESH_TOKEN_FILE", None)
            env.update(self._keys.environment(instance.spec.mesh_role))
        for needed, variable in instance.spec.needs.items():
            # Started in an earlier stage, so their addresses are known.
            env[variable] = ",".join(c.address or "" for c in self.children if c.instance.spec.name == needed)
        env.update(self._service_env.get(instance.spec.name, {}))
        env.update(instance.env)
        # gRPC's C-core logs a failed bind (add_port.cc) before the service says what it means; Quarry's own
        # messages say it all. GRPC_VERBOSITY set by the user brings gRPC's logging back.
        env["GRPC_VERBOSITY"] = os.environ.get("GRPC_VERBOSITY", "NONE")
        return env

    async def _launch(self, child: Child) -> None:
        """Start the child's process and wait until it serves."""
        child.port_file.unlink(missing_ok=True)
        command = serve_command(
            child.instance.spec.name, child.port_file, address=child.address, parent_pid=os.getpid()
        )
        # A session of its own: Ctrl-C reaches only us, and we stop the children in order.
        child.process = await asyncio.create_subprocess_exec(*command, env=child.env, start_new_session=True)
        child.address = await _wait_ready(child, asyncio.get_running_loop().time() + self._ready_timeout)

    async def start(self, instances: Sequence[Instance]) -> None:
        """Start the instances at once and wait until all serve; the first to fail cancels the others."""
        children = [
            Child(instance, self._run_dir / f"{instance.name}.addr", self._environment(instance), instance.address)
            for instance in instances
        ]
        self.children.extend(children)
        try:
            async with asyncio.TaskGroup() as group:
                for child in children:
                    group.create_task(self._launch(child))
        except ExceptionGroup as errors:
            raise errors.exceptions[0] from None

    async def keep(self, child: Child) -> str:
        """Restart `child` each time it exits, within the policy's bound; returns why it gave up."""
        loop = asyncio.get_running_loop()
        policy = self._policy
        while True:
            assert child.process is not None
            status = await child.process.wait()
            now = loop.time()
            child.exits.append(now)
            while child.exits[0] <= now - policy.window_seconds:
                child.exits.popleft()
            exits = len(child.exits)
            if exits > policy.max_restarts:
                return (
                    f"{child.name} {describe_exit(status)}: {exits} exits within {policy.window_seconds:g} s, "
                    f"more than the {policy.max_restarts} restarts allowed; not restarting it again"
                )
            delay = policy.delay(exits)
            self._announce.restarting(child.name, describe_exit(status), delay, exits, policy)
            await asyncio.sleep(delay)
            try:
                await self._launch(child)
            except LaunchError as error:
                self._announce.restart_failed(str(error))
                if child.running():  # it hangs: as good as dead, and counted so
                    assert child.process is not None
                    child.process.kill()
                continue
            child.restarts += 1
            self.publish()  # before the announcement: whoever reads it finds the new state
            self._announce.restarted(child.name, self.rows())

    async def stop(self, grace: float) -> None:
        """Stop the children stage by stage: SIGTERM, then SIGKILL for whoever outlives the grace period."""
        for stage in stop_stages(self.children):
            stopping = [child for child in stage if child.running()]
            for child in stopping:
                assert child.process is not None
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
            await asyncio.gather(*(self._reap(child, grace) for child in stopping))

    async def _reap(self, child: Child, grace: float) -> None:
        process = child.process
        assert process is not None
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        self._announce.stopped(child.name, process.returncode or 0)


async def _supervise(group: ProcessGroup, stop_requested: asyncio.Event, announce: Announcer) -> int:
    """Keep every child running until a stop request (0) or until one of them dies too often (1)."""
    keepers = [asyncio.create_task(group.keep(child)) for child in group.children]
    try:
        if await _stop_requested_first(keepers, stop_requested):
            announce.stopping()
            return 0
        announce.failed("; ".join(task.result() for task in keepers if task.done()))
        return 1
    finally:
        for task in keepers:
            task.cancel()
        await asyncio.gather(*keepers, return_exceptions=True)


async def run_process_group(
    instances: Sequence[Instance],
    *,
    data_dir: Path,
    ready_timeout: float,
    stop_timeout: float,
    announce: Announcer,
    policy: RestartPolicy | None = None,
    service_env: Mapping[str, Mapping[str, str]] | None = None,
) -> int:
    """Start the instances, announce them once all serve, and keep them running until told to stop.

    Returns 0 after a requested stop, 1 when a service failed to start or kept dying.
    """
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_requested.set)
    try:
        if warning := private_data_dir(data_dir):
            announce.warning(warning)
        with data_dir_lock(data_dir), tempfile.TemporaryDirectory(prefix="quarry-up-") as run_dir:
            policy = policy or RestartPolicy()
            group = ProcessGroup(
                Path(run_dir),
                data_dir,
                ready_timeout=ready_timeout,
                policy=policy,
                announce=announce,
                service_env=service_env,
            )
            try:
                for stage in start_stages(instances):
                    starting = asyncio.create_task(group.start(stage))
                    if await _stop_requested_first([starting], stop_requested):
                        starting.cancel()
                        await asyncio.wait([starting])
                        return 0
                    starting.result()
                group.publish()
                announce.ready(group.rows())
                return await _supervise(group, stop_requested, announce)
            finally:
                group.unpublish()  # first: no command should find services that are going away
                await group.stop(stop_timeout)
    except LaunchError as error:
        announce.failed(str(error))
        return 1
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
