"""Transport security and access: TLS or mutual TLS between services, bearer tokens, connection limits.

One set of files serves a process both ways: its certificate and key are its
server identity and, under mutual TLS, its client identity too; the CA
verifies the other side. Health and reflection stay open on every server
(Kubernetes probes and grpcurl need them); `guarded` is how the authentication
of callers (quarry.mesh_auth, quarry.api_auth) wraps the methods it guards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from quarry.config import ConfigurationError

if TYPE_CHECKING:
    from quarry.config import QuarrySettings

    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor

__all__ = [
    "ConnectionLimits",
    "MethodGuard",
    "Tls",
    "TlsConfigurationError",
    "bearer_metadata",
    "certificate_names",
    "guarded",
    "presented_token",
]


class TlsConfigurationError(ConfigurationError):
    """TLS files that cannot be used, named by the setting that points at them."""


def _read(path: str, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise TlsConfigurationError(f"{setting}={path}: {error.strerror}") from error


@dataclass(frozen=True)
class Tls:
    certificate: bytes | None
    private_key: bytes | None
    ca: bytes | None
    require_client_certificate: bool

    @classmethod
    def from_settings(cls, common: QuarrySettings) -> Tls | None:
        """None when no TLS file is configured: plaintext, for a laptop or a mesh with its own mTLS."""
        if not (common.tls_cert_file or common.tls_key_file or common.tls_ca_file):
            return None
        if bool(common.tls_cert_file) != bool(common.tls_key_file):
            raise TlsConfigurationError("QUARRY_TLS_CERT_FILE and QUARRY_TLS_KEY_FILE go together")
        if not common.tls_ca_file:
            # Without it, calls to other services would check their internal certificates against public roots.
            raise TlsConfigurationError("TLS between services needs QUARRY_TLS_CA_FILE, the CA that signed them")
        return cls(
            certificate=_read(common.tls_cert_file, "QUARRY_TLS_CERT_FILE") if common.tls_cert_file else None,
            private_key=_read(common.tls_key_file, "QUARRY_TLS_KEY_FILE") if common.tls_key_file else None,
            ca=_read(common.tls_ca_file, "QUARRY_TLS_CA_FILE") if common.tls_ca_file else None,
            require_client_certificate=common.tls_require_client_cert and bool(common.tls_ca_file),
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.certificate is None or self.private_key is None:
            raise TlsConfigurationError("a TLS server needs QUARRY_TLS_CERT_FILE and QUARRY_TLS_KEY_FILE")
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate)],
            root_certificates=self.ca if self.require_client_certificate else None,
            require_client_auth=self.require_client_certificate,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Verifies the server with the CA; presents this process's certificate for mutual TLS."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.private_key, certificate_chain=self.certificate
        )


@dataclass(frozen=True)
class ConnectionLimits:
    max_message_bytes: int = 8 * 1024 * 1024
    # After this long the server asks the client to reconnect (GOAWAY), so clients re-resolve and reach
    # workers added since; calls in flight get `max_connection_age_grace_seconds` to finish.
    max_connection_age_seconds: float = 300.0
    max_connection_age_grace_seconds: float = 3600.0
    keepalive_seconds: float = 30.0

    @classmethod
    def from_settings(cls, common: QuarrySettings) -> ConnectionLimits:
        return cls(
            max_message_bytes=common.max_message_bytes,
            max_connection_age_seconds=common.max_connection_age_seconds,
            max_connection_age_grace_seconds=common.max_connection_age_grace_seconds,
            keepalive_seconds=common.keepalive_seconds,
        )

    def server_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_connection_age_ms", int(self.max_connection_age_seconds * 1000)),
            ("grpc.max_connection_age_grace_ms", int(self.max_connection_age_grace_seconds * 1000)),
            ("grpc.keepalive_time_ms", int(self.keepalive_seconds * 1000)),
            ("grpc.keepalive_timeout_ms", 10_000),
            # Clients ping every keepalive_seconds, even when idle: allow that, not more often.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", int(self.keepalive_seconds * 1000 / 2)),
            ("grpc.http2.max_pings_without_data", 0),
        ]

    def channel_options(self) -> list[tuple[str, int | str]]:
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", int(self.keepalive_seconds * 1000)),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # A DNS name with several addresses (a headless Service) is balanced call by call, over the
            # servers whose health service says SERVING: a stopping worker gets no new delegations.
            (
                "grpc.service_config",
                '{"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": ""}}',
            ),
        ]


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def presented_token(context: Any) -> str:
    """The bearer token the caller sent, or "" when it sent none."""
    presented = str(dict(context.invocation_metadata() or ()).get("authorization", ""))
    scheme, _, token = presented.partition(" ")
    return token if scheme == "Bearer" else ""


def certificate_names(context: Any) -> list[str]:
    """The common names of the caller's client certificate; grpc fills them only for one the server's CA verified."""
    auth = context.auth_context() or {}
    return [name.decode(errors="replace") for name in auth.get("x509_common_name", [])]


Check = Callable[[Any], Awaitable[None] | None]


async def _run_check(check: Check, context: Any) -> None:
    outcome = check(context)
    if outcome is not None:  # a check that may need to look something up is a coroutine
        await outcome


def guarded(handler: grpc.RpcMethodHandler[Any, Any], check: Check) -> grpc.RpcMethodHandler[Any, Any]:
    """The same handler, calling `check(context)` (awaited when it is a coroutine) before anything else;
    what check raises ends the call."""
    if handler.unary_unary is not None:
        behavior = handler.unary_unary

        async def unary(request: Any, context: Any) -> Any:
            await _run_check(check, context)
            return await behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
    if handler.unary_stream is not None:
        stream_behavior: Any = handler.unary_stream  # an async generator on the aio server (grpc-stubs says sync)

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await _run_check(check, context)
            async for response in stream_behavior(request, context):
                yield response

        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
    raise TypeError("only unary and server-streaming methods can be guarded")


class MethodGuard(_ServerInterceptor):
    """Guards every method of the services in `access` (full service name -> method -> who may call it) with
    the check `checker` makes for it. A method missing from its service's table is allowed to no one: a new RPC
    stays closed until someone decides who may call it. Services not named (health, reflection) stay open.
    """

    def __init__(self, access: Mapping[str, Mapping[str, frozenset[Any]]]) -> None:
        self._access = dict(access)

    def checker(self, method: str, allowed: frozenset[Any]) -> Check:
        raise NotImplementedError

    async def intercept_service(  # type: ignore[override]
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        service, _, method = details.method.lstrip("/").partition("/")
        table = self._access.get(service)
        if handler is None or table is None:
            return handler
        return guarded(handler, self.checker(method, table.get(method, frozenset())))
