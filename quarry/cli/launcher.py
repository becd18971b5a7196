"""`quarry up`: every service as its own OS process, supervised until Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.cli.registry import ServiceSpec
from quarry.client import open_channel
from quarry.config import QuarrySettings
from quarry.mesh import MeshKeys
from quarry.security import Tls

READY_POLL_SECONDS = 0.1


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


@dataclass
class RunningService:
    name: str
    process: asyncio.subprocess.Process
    port_file: Path
    address: str = ""


async def _wait_ready(service: RunningService, deadline: float) -> None:
    """Wait for the child to write its bound address, then for health to say SERVING."""
    loop = asyncio.get_running_loop()
    while not service.address:
        if service.process.returncode is not None:
            raise LaunchError(f"{service.name} exited with status {service.process.returncode} while starting")
        if loop.time() > deadline:
            raise LaunchError(f"{service.name} did not bind an address in time")
        if service.port_file.exists():
            service.address = service.port_file.read_text().strip()
        else:
            await asyncio.sleep(READY_POLL_SECONDS)
    # The services' own TLS settings (the environment they inherit), so the check speaks their protocol.
    async with open_channel(service.address, tls=Tls.from_settings(QuarrySettings())) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if service.process.returncode is not None:
                raise LaunchError(f"{service.name} exited with status {service.process.returncode} while starting")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise LaunchError(f"{service.name} did not report SERVING in time")
            with contextlib.suppress(grpc.aio.AioRpcError):
                response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=min(remaining, 2.0))
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(READY_POLL_SECONDS)


async def _stop(services: Sequence[RunningService], grace: float) -> None:
    """SIGTERM every child (reverse start order), then SIGKILL whoever outlives the grace period."""
    for service in reversed(services):
        if service.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                service.process.send_signal(signal.SIGTERM)
    for service in reversed(services):
        try:
            await asyncio.wait_for(service.process.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                service.process.kill()
            await service.process.wait()


async def _start(
    spec: ServiceSpec, started: Sequence[RunningService], run_dir: Path, address: str | None, keys: MeshKeys | None
) -> RunningService:
    env = os.environ.copy()
    # Each child gets its own mesh token (none for a service that calls no other) and every peer's digest.
    if keys is not None:
        env.pop("QUARRY_MESH_TOKEN", None)
        env.update(keys.environment(spec.mesh_role))
    for needed, variable in spec.needs.items():
        # Started earlier (SERVICES lists dependencies first), so its address is known.
        env[variable] = next(s.address for s in started if s.name == needed)
    port_file = run_dir / f"{spec.name}.addr"
    command = serve_command(spec.name, port_file, address=address, parent_pid=os.getpid())
    # A session of its own: Ctrl-C reaches only us, and we stop the children in order.
    process = await asyncio.create_subprocess_exec(*command, env=env, start_new_session=True)
    return RunningService(spec.name, process, port_file)


async def _stop_requested_first(tasks: Collection[asyncio.Task[Any]], stop_requested: asyncio.Event) -> bool:
    """Wait until one of `tasks` ends or a stop is requested; True for a stop. The tasks are left running."""
    stopping = asyncio.create_task(stop_requested.wait())
    await asyncio.wait({*tasks, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    return stop_requested.is_set()


async def _start_in_order(
    specs: Sequence[ServiceSpec],
    services: list[RunningService],
    run_dir: Path,
    addresses: dict[str, str],
    ready_timeout: float,
    stop_requested: asyncio.Event,
) -> bool:
    """Start each service once the one before it serves, appending it to `services`; False after a stop request."""
    loop = asyncio.get_running_loop()
    # Fresh for every `quarry up`: the services it starts trust each other, and no one else.
    # QUARRY_MESH_INSECURE=true (a machine one person uses, debugging by hand) runs them unauthenticated.
    keys = None if QuarrySettings().mesh_insecure else MeshKeys.generate()
    for spec in specs:
        service = await _start(spec, services, run_dir, addresses.get(spec.name), keys)
        services.append(service)
        starting = asyncio.create_task(_wait_ready(service, loop.time() + ready_timeout))
        if await _stop_requested_first([starting], stop_requested):
            starting.cancel()
            return False
        starting.result()
    return True


async def _supervise(services: Sequence[RunningService], stop_requested: asyncio.Event, announce: Announcer) -> int:
    """Announce the running services and wait for a stop request (0) or for one of them to die (1)."""
    announce.ready([(s.name, s.address, s.process.pid) for s in services])
    exits = [asyncio.create_task(s.process.wait()) for s in services]
    stopped = await _stop_requested_first(exits, stop_requested)
    for task in exits:
        task.cancel()
    if stopped:
        announce.stopping()
        return 0
    dead = [s for s in services if s.process.returncode is not None]
    announce.failed(", ".join(f"{s.name} exited with status {s.process.returncode}" for s in dead))
    return 1


async def run_mesh(
    specs: Sequence[ServiceSpec],
    *,
    addresses: dict[str, str],
    ready_timeout: float,
    stop_timeout: float,
    announce: Announcer,
) -> int:
    """Start the named services, announce them once all serve, and supervise until told to stop.

    Returns 0 after a requested stop, 1 when a service failed to start or died.
    """
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_requested.set)
    services: list[RunningService] = []
    with tempfile.TemporaryDirectory(prefix="quarry-up-") as run_dir:
        try:
            if not await _start_in_order(specs, services, Path(run_dir), addresses, ready_timeout, stop_requested):
                return 0
            return await _supervise(services, stop_requested, announce)
        except LaunchError as error:
            announce.failed(str(error))
            return 1
        finally:
            await _stop(services, stop_timeout)
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)


class Announcer:
    """Prints what `quarry up` is doing; a class so tests and other front ends can replace it."""

    def __init__(self, data_dir: Path) -> None:
        from rich.console import Console

        self._console = Console(highlight=False)
        self._data_dir = data_dir

    def ready(self, services: Sequence[tuple[str, str, int]]) -> None:
        from rich.table import Table

        table = Table(title="quarry is up", title_justify="left")
        table.add_column("service")
        table.add_column("address")
        table.add_column("pid", justify="right")
        for name, address, pid in services:
            table.add_row(name, address, str(pid))
        self._console.print(table)
        # One plain line per service, stable for scripts: "<name> <address>".
        for name, address, _pid in services:
            print(f"serving {name} {address}", flush=True)
        self._console.print(f"data: {self._data_dir}\nCtrl-C stops every service.")

    def stopping(self) -> None:
        self._console.print("stopping…")

    def failed(self, reason: str) -> None:
        self._console.print(f"[red]quarry up failed:[/red] {reason}")
