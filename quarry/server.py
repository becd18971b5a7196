"""The service kernel: a grpc.aio server with health, diagnostics, reflection and error translation.

`create_server` builds and binds a server (tests bind port 0); `ServiceHost` owns
start and stop of one service process, including graceful shutdown on SIGTERM.
Every server runs the interceptors of `quarry.interceptors`: errors translated,
RPCs measured, requests decoded after the callers are authenticated.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from quarry.api_auth import ApiAuthentication
from quarry.config import QuarrySettings, ServiceSettings
from quarry.convert import diagnostics_report_to_proto
from quarry.diagnostics import Diagnoser, Diagnostics
from quarry.interceptors import ErrorTranslationInterceptor, RequestDecodingInterceptor
from quarry.mesh_auth import Access, MeshAuthentication, mesh_guard
from quarry.security import ConnectionLimits, Tls
from quarry.v1 import diagnostics_pb2, diagnostics_pb2_grpc

__all__ = [
    "BoundServer",
    "ServiceHost",
    "ServiceRegistration",
    "create_server",
    "serve_until_signalled",
    "service_host",
    "stop_signals",
]

log = logging.getLogger(__name__)

_DIAGNOSTICS_SERVICE = diagnostics_pb2.DESCRIPTOR.services_by_name["DiagnosticsService"].full_name

if TYPE_CHECKING:
    Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True)
class ServiceRegistration:
    """One gRPC service to serve: its full name and how to add its servicer."""

    full_name: str
    register: Callable[[grpc.aio.Server], None]


class _HealthServicer(health.aio.HealthServicer):  # type: ignore[misc,name-defined]
    """grpc's health servicer, plus List, which the health proto has and grpc's servicer does not implement."""

    async def List(self, request: health_pb2.HealthListRequest, context: Context) -> health_pb2.HealthListResponse:
        return health_pb2.HealthListResponse(
            statuses={
                name: health_pb2.HealthCheckResponse(status=status) for name, status in self._server_status.items()
            }
        )


class _DiagnosticsServicer(diagnostics_pb2_grpc.DiagnosticsServiceServicer):
    def __init__(self, diagnoser: Diagnoser) -> None:
        self._diagnoser = diagnoser

    async def GetDiagnostics(
        self, request: diagnostics_pb2.GetDiagnosticsRequest, context: Context
    ) -> diagnostics_pb2.GetDiagnosticsResponse:
        return diagnostics_report_to_proto(await self._diagnoser.report())


@dataclass
class BoundServer:
    server: grpc.aio.Server
    port: int
    health: Any  # grpc_health.v1.health.aio.HealthServicer, which grpc-stubs does not describe
    service_names: list[str] = field(default_factory=list)

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.service_names]:
            await self.health.set(name, status)


def create_server(
    address: str,
    services: Sequence[ServiceRegistration],
    *,
    tls: Tls | None = None,
    limits: ConnectionLimits | None = None,
    api: ApiAuthentication | None = None,
    mesh: MeshAuthentication | None = None,
    diagnostics: Diagnostics | None = None,
) -> tuple[BoundServer, int]:
    """Build a server for `services` plus health, diagnostics and reflection, bound to `address`.

    Returns the server and the port it bound (useful with port 0). The owner
    starts it and reports health with `set_serving`. With `tls`, the port is
    TLS (mutual when it requires client certificates); `api` authenticates the
    callers of the public services and checks their roles; `mesh` authenticates the
    callers of internal services. Health, diagnostics and reflection are named
    in neither, so they stay open; `diagnostics` is what the service reports.
    """
    limits = limits or ConnectionLimits()
    server = grpc.aio.server(
        # The error translation first (its span, when tracing, covers the handler), so it reports the
        # authentication's refusals and undecodable requests; the request is decoded last, so an
        # unauthenticated caller's body is never parsed.
        interceptors=[
            ErrorTranslationInterceptor(),
            *([api] if api else []),
            *([mesh] if mesh else []),
            RequestDecodingInterceptor(),
        ],
        options=[*limits.server_options(), ("grpc.so_reuseport", 0)],
    )
    health_servicer = _HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in services:
        service.register(server)
    names = [service.full_name for service in services]
    diagnoser = Diagnoser(diagnostics or Diagnostics(service=", ".join(names)))
    diagnostics_pb2_grpc.add_DiagnosticsServiceServicer_to_server(_DiagnosticsServicer(diagnoser), server)
    health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    reflection.enable_server_reflection([*names, health_name, _DIAGNOSTICS_SERVICE, reflection.SERVICE_NAME], server)
    try:
        port = server.add_secure_port(address, tls.server_credentials()) if tls else server.add_insecure_port(address)
    except RuntimeError as error:  # grpc reports a failed bind this way
        raise OSError(
            f"could not bind {address}: is the port in use? Choose another address in the service's "
            "*_ADDRESS setting, or run `quarry up --ephemeral-ports`"
        ) from error
    return BoundServer(server=server, port=port, health=health_servicer, service_names=names), port


Hook = Callable[[], Awaitable[None]]
# A problem that should take the service out of rotation, described; None while there is none.
HealthCheck = Callable[[], str | None]
# How often a host asks its health checks.
HEALTH_CHECK_SECONDS = 2.0


class ServiceHost:
    """Owns one service's server from start to a graceful stop.

    Shutdown order: health turns NOT_SERVING (load balancers stop routing), the
    server stops taking RPCs and gives in-flight ones `grace` seconds while the
    `on_drain` hooks end streams and finish queued work, then `on_stopped` hooks
    release resources such as database pools.
    """

    def __init__(
        self,
        address: str,
        services: Sequence[ServiceRegistration],
        *,
        grace: float = 5.0,
        on_drain: Sequence[Hook] = (),
        on_stopped: Sequence[Hook] = (),
        tls: Tls | None = None,
        limits: ConnectionLimits | None = None,
        api: ApiAuthentication | None = None,
        mesh: MeshAuthentication | None = None,
        diagnostics: Diagnostics | None = None,
        health_address: str = "",
        health_checks: Sequence[HealthCheck] = (),
    ) -> None:
        """`health_checks` are asked every few seconds while serving: when one names a problem (the
        database's disk is full) health reports NOT_SERVING until none does."""
        self._health_checks = list(health_checks)
        self._health_watch: asyncio.Task[None] | None = None
        self._tls = tls
        # A plaintext port with only the health service, for probes that cannot speak TLS (Kubernetes').
        self._health_address = health_address
        self._health_server: grpc.aio.Server | None = None
        self.health_port = 0
        self._limits = limits
        self._api = api
        self._mesh = mesh
        self._diagnostics = diagnostics
        self._address = address
        self._services = services
        self._grace = grace
        self._on_drain = list(on_drain)
        self._on_stopped = list(on_stopped)
        self._bound: BoundServer | None = None
        self._started = asyncio.Event()
        self._stopped = asyncio.Event()
        self.port = 0

    @property
    def address(self) -> str:
        host = self._address.rpartition(":")[0]
        return f"{host}:{self.port}"

    async def start(self) -> int:
        self._bound, self.port = create_server(
            self._address,
            self._services,
            tls=self._tls,
            limits=self._limits,
            api=self._api,
            mesh=self._mesh,
            diagnostics=self._diagnostics,
        )
        await self._bound.server.start()
        if self._health_address:
            self._health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
            health_pb2_grpc.add_HealthServicer_to_server(self._bound.health, self._health_server)
            try:
                self.health_port = self._health_server.add_insecure_port(self._health_address)
            except RuntimeError as error:
                raise OSError(
                    f"could not bind the health address {self._health_address}: is the port in use?"
                ) from error
            await self._health_server.start()
        await self._bound.set_serving(True)
        if self._health_checks:
            self._health_watch = asyncio.create_task(self._watch_health(self._bound))
        self._started.set()
        log.info("serving %s on %s", ", ".join(self._bound.service_names), self.address)
        return self.port

    async def _watch_health(self, bound: BoundServer) -> None:
        """Health follows the checks until the host stops (the task is cancelled then)."""
        serving = True
        while not self._stopped.is_set():
            await asyncio.sleep(HEALTH_CHECK_SECONDS)
            problems = [problem for check in self._health_checks if (problem := check())]
            if serving == bool(problems) and not self._stopped.is_set():
                serving = not problems
                if problems:
                    log.error("reporting NOT_SERVING: %s", "; ".join(problems))
                else:
                    log.warning("serving again: the problem behind NOT_SERVING is gone")
                await bound.set_serving(serving)

    async def wait_started(self) -> None:
        await self._started.wait()

    async def shutdown(self) -> None:
        """Stop gracefully; idempotent. Every hook is bounded by the grace period."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._health_watch is not None:
            self._health_watch.cancel()
        if self._bound is not None:
            await self._bound.set_serving(False)
            stopping = asyncio.create_task(self._bound.server.stop(self._grace))
            for hook in self._on_drain:
                await _run_hook(hook, self._grace)
            await stopping
        if self._health_server is not None:
            await self._health_server.stop(None)
        # Also after a failed start: the hooks release what the builder opened.
        for hook in self._on_stopped:
            await _run_hook(hook, self._grace)
        if self._bound is not None:
            log.info("stopped %s", self.address)

    async def __aenter__(self) -> ServiceHost:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()


def service_host(
    settings: ServiceSettings,
    common: QuarrySettings,
    registration: ServiceRegistration,
    *,
    also: Sequence[ServiceRegistration] = (),
    on_drain: Sequence[Hook] = (),
    on_stopped: Sequence[Hook] = (),
    api: ApiAuthentication | None = None,
    access: Access | None = None,
    diagnostics: Diagnostics | None = None,
    health_checks: Sequence[HealthCheck] = (),
) -> ServiceHost:
    """The host of one service as configured: its address and health port, TLS, limits and grace.

    `also` are services served beside it on the same port (the supervisor's campaigns).
    An internal service passes its `access` table: its callers must then prove a mesh role it allows.
    `diagnostics` is what the service reports about itself to anyone who asks (`quarry doctor`).
    """
    mesh = None if access is None else mesh_guard(common, {registration.full_name: access}, settings.service_name)
    return ServiceHost(
        settings.address,
        [registration, *also],
        grace=common.shutdown_grace_seconds,
        on_drain=on_drain,
        on_stopped=on_stopped,
        tls=Tls.from_settings(common),
        limits=ConnectionLimits.from_settings(common),
        api=api,
        mesh=mesh,
        diagnostics=diagnostics,
        health_address=settings.health_address,
        health_checks=health_checks,
    )


async def _run_hook(hook: Hook, limit_seconds: float) -> None:
    try:
        await asyncio.wait_for(hook(), max(limit_seconds, 1.0))
    except TimeoutError:
        log.error("shutdown hook %r did not finish within %.1fs; moving on", hook, limit_seconds)
    except Exception:
        log.exception("shutdown hook %r failed", hook)


def _freeze_startup_heap() -> None:
    """Put what a started service holds for good (modules, the server, pools: ~180k objects) beyond the
    garbage collector, so that a full collection scans only what requests create. Without it a full
    collection every few hundred requests stalled an RPC for 100 ms and more."""
    gc.collect()
    gc.freeze()


def stop_signals() -> asyncio.Event:
    """An event SIGTERM and SIGINT set from now on, in the running loop (its handlers stay until the loop's
    owner removes them): installed before a service is built, a Ctrl-C while it builds stops it once built,
    instead of cancelling whatever step the build was in."""
    loop = asyncio.get_running_loop()
    requested = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, requested.set)
    return requested


async def serve_until_signalled(host: ServiceHost, requested: asyncio.Event | None = None) -> None:
    """Start `host` and run until SIGTERM or SIGINT (`requested`, when the signals were taken in hand before the
    host was built), then shut it down gracefully."""
    loop = asyncio.get_running_loop()
    requested = requested or stop_signals()
    try:
        await host.start()
        _freeze_startup_heap()
        await requested.wait()
        log.info("shutdown requested")
    finally:
        # The handlers stay until shutdown is done, so a second signal cannot cut the drain short.
        await host.shutdown()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
