"""TLS and mutual TLS between services, the supervisor's bearer token, and connection ageing.

Certificates are generated here (a CA, a server and a client certificate, and a
stranger's CA), so the real TLS handshakes of grpc run over real sockets.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from quarry.clients.channels import open_channel
from quarry.clients.runs import RunsClient
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import ConfigurationError, QuarrySettings, ScratchpadSettings, SupervisorSettings
from quarry.mesh_auth import mesh_guard
from quarry.security import ConnectionLimits, Tls
from quarry.server import ServiceHost, ServiceRegistration
from quarry.v1 import common_pb2, scratchpad_pb2
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.service import build_host as build_supervisor
from tests.conftest import reusable_port
from tests.rpc import error_reason, expect_error

Key = ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _certificate(
    subject: str, key: Key, issuer: x509.Certificate | None, issuer_key: Key, *, ca: bool
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer.subject if issuer else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


@dataclass
class Pki:
    directory: Path

    def authority(self, name: str) -> tuple[x509.Certificate, Key]:
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = _certificate(name, key, None, key, ca=True)
        (self.directory / f"{name}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return certificate, key

    def issue(self, name: str, authority: tuple[x509.Certificate, Key]) -> tuple[str, str]:
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = _certificate(name, key, authority[0], authority[1], ca=False)
        cert_path, key_path = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_pem(key))
        return str(cert_path), str(key_path)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


def settings(tmp_path: Path, cert: tuple[str, str] | None, ca: str = "", **extra: Any) -> QuarrySettings:
    cert_file, key_file = cert or ("", "")
    return QuarrySettings(data_dir=tmp_path, tls_cert_file=cert_file, tls_key_file=key_file, tls_ca_file=ca, **extra)


async def create_thread(address: str, tls: Tls | None) -> str:
    async with open_channel(address, tls=tls) as channel:
        thread = await ScratchpadClient(channel, retry=None).create_thread(title="tls")
    return thread.thread_id


async def test_mutual_tls_refuses_clients_without_a_valid_certificate(pki: Pki, tmp_path: Path) -> None:
    authority = pki.authority("quarry-ca")
    stranger = pki.authority("stranger-ca")
    ca = str(tmp_path / "quarry-ca.pem")
    server = settings(tmp_path, pki.issue("scratchpad", authority), ca)
    host = await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), server)
    async with host:
        # A peer with a certificate from the mesh's CA gets in.
        member = Tls.from_settings(settings(tmp_path, pki.issue("worker", authority), ca))
        assert await create_thread(host.address, member)
        refused = {
            "no certificate": Tls.from_settings(settings(tmp_path, None, ca)),
            "another CA's certificate": Tls.from_settings(settings(tmp_path, pki.issue("intruder", stranger), ca)),
            "plaintext": None,
        }
        for why, tls in refused.items():
            async with open_channel(host.address, tls=tls) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE, why


async def test_under_mutual_tls_a_certificate_common_name_proves_a_mesh_role(pki: Pki, tmp_path: Path) -> None:
    authority = pki.authority("quarry-ca")
    ca = str(tmp_path / "quarry-ca.pem")
    peers = "supervisor=cn:quarry-supervisor"
    server = settings(tmp_path, pki.issue("scratchpad", authority), ca, mesh_peers=peers, mesh_insecure=False)
    host = await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), server)
    async with host:
        supervisor = Tls.from_settings(settings(tmp_path, pki.issue("quarry-supervisor", authority), ca))
        assert await create_thread(host.address, supervisor)
        # Signed by the same CA, but not a name the scratchpad accepts as a peer.
        other = Tls.from_settings(settings(tmp_path, pki.issue("quarry-worker", authority), ca))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await create_thread(host.address, other)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_peer_named_by_certificate_needs_mutual_tls(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="mutual TLS is not on"):
        mesh_guard(settings(tmp_path, None, mesh_peers="worker=cn:quarry-worker"), {}, "scratchpad")


async def test_server_only_tls_verifies_the_server(pki: Pki, tmp_path: Path) -> None:
    authority = pki.authority("quarry-ca")
    ca = str(tmp_path / "quarry-ca.pem")
    server = settings(tmp_path, pki.issue("scratchpad", authority), ca, tls_require_client_cert=False)
    host = await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), server)
    async with host:
        assert await create_thread(host.address, Tls.from_settings(settings(tmp_path, None, ca)))
        pki.authority("other-ca")
        wrong_ca = Tls.from_settings(settings(tmp_path, None, str(tmp_path / "other-ca.pem")))
        async with open_channel(host.address, tls=wrong_ca) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_unreadable_tls_files_are_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="QUARRY_TLS_CERT_FILE"):
        missing = (str(tmp_path / "missing.crt"), str(tmp_path / "missing.key"))
        Tls.from_settings(settings(tmp_path, missing, str(tmp_path / "ca.pem")))
    with pytest.raises(ConfigurationError, match="QUARRY_TLS_CA_FILE"):
        Tls.from_settings(settings(tmp_path, (str(tmp_path / "a.crt"), str(tmp_path / "a.key"))))
    with pytest.raises(ConfigurationError, match="go together"):
        Tls.from_settings(QuarrySettings(data_dir=tmp_path, tls_cert_file=str(tmp_path / "x")))


@pytest.fixture
async def guarded_supervisor(tmp_path: Path) -> AsyncIterator[str]:
    supervisor = SupervisorSettings(
        address="127.0.0.1:0",
        auth_token="s3cret-token",
        worker_addresses=f"127.0.0.1:{reusable_port()}",  # never called here
        scratchpad_address=f"127.0.0.1:{reusable_port()}",
    )
    host = await build_supervisor(supervisor, QuarrySettings(data_dir=tmp_path))
    async with host:
        yield host.address


async def test_the_supervisor_wants_its_bearer_token_but_probes_and_reflection_stay_open(
    guarded_supervisor: str,
) -> None:
    missing_id = "run-" + "0" * 32
    for token in ("", "wrong"):
        async with RunsClient.connect(guarded_supervisor, api_key=token) as client:
            error = await expect_error(client.get_run(missing_id), grpc.StatusCode.UNAUTHENTICATED)
            assert error_reason(error) == "BEARER_TOKEN_INVALID"
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async for _ in client.stream_run(missing_id):
                    pass
            assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with RunsClient.connect(guarded_supervisor, api_key="s3cret-token") as client:
        await expect_error(client.get_run(missing_id), grpc.StatusCode.NOT_FOUND)  # past the check
        # Streams carry the token too (grpc files a client interceptor under one kind of call only).
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in client.stream_run(missing_id):
                pass
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        listed = await client.list_runs()
        assert list(listed.runs) == []
    async with open_channel(guarded_supervisor) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        services = [s.name async for r in responses for s in r.list_services_response.service]
    assert "quarry.v1.SupervisorService" in services


async def test_under_mutual_tls_a_certificate_common_name_may_stand_for_an_api_principal(
    pki: Pki, tmp_path: Path
) -> None:
    authority = pki.authority("quarry-ca")
    ca = str(tmp_path / "quarry-ca.pem")
    supervisor = SupervisorSettings(
        address="127.0.0.1:0",
        client_certificates="cn:ci-runner=ci:researcher",
        worker_addresses=f"127.0.0.1:{reusable_port()}",  # never reached: the run fails, as it may here
        scratchpad_address=f"127.0.0.1:{reusable_port()}",
    )
    host = await build_supervisor(supervisor, settings(tmp_path, pki.issue("supervisor", authority), ca))
    async with host:
        ci = Tls.from_settings(settings(tmp_path, pki.issue("ci-runner", authority), ca))
        async with RunsClient.connect(host.address, api_key="", tls=ci) as client:
            assert (await client.start_run("From the CI runner?")).created_by == "ci"
        # Signed by the same CA, but a name no principal is mapped to.
        other = Tls.from_settings(settings(tmp_path, pki.issue("someone-else", authority), ca))
        async with RunsClient.connect(host.address, api_key="", tls=other) as client:
            await expect_error(client.list_runs(), grpc.StatusCode.UNAUTHENTICATED)


class _Peers:
    """A tiny service that records the client address (host:port) of each call's connection."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def check(self, request: Any, context: Any) -> health_pb2.HealthCheckResponse:
        self.seen.append(context.peer())
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def test_connections_are_recycled_after_their_maximum_age(tmp_path: Path) -> None:
    peers = _Peers()

    def register(server: grpc.aio.Server) -> None:
        handler = grpc.method_handlers_generic_handler(
            "test.Peers",
            {
                "Check": grpc.unary_unary_rpc_method_handler(
                    peers.check,
                    request_deserializer=health_pb2.HealthCheckRequest.FromString,
                    response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))

    limits = ConnectionLimits(max_connection_age_seconds=1.0, max_connection_age_grace_seconds=1.0)
    host = ServiceHost("127.0.0.1:0", [ServiceRegistration("test.Peers", register)], grace=1, limits=limits)
    async with host, open_channel(host.address) as channel:
        call = channel.unary_unary(
            "/test.Peers/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        await call(health_pb2.HealthCheckRequest(), timeout=5)
        await call(health_pb2.HealthCheckRequest(), timeout=5)
        await asyncio.sleep(4)  # past the age (grpc adds up to 10 % jitter) and its grace
        await call(health_pb2.HealthCheckRequest(), timeout=5)
    assert peers.seen[0] == peers.seen[1], "one connection while it is young"
    assert peers.seen[2] != peers.seen[0], "a new connection once it has aged"


async def test_messages_over_the_limit_are_refused(tmp_path: Path) -> None:
    small = QuarrySettings(data_dir=tmp_path, max_message_bytes=64 * 1024)
    host = await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0", max_content_bytes=1024 * 1024), small)
    async with host, open_channel(host.address) as channel:
        client = ScratchpadClient(channel)
        thread = await client.create_thread(title="big")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await client.append(
                thread.thread_id,
                kind=scratchpad_pb2.ENTRY_KIND_NOTE,
                author=common_pb2.Principal(principal_id="me", role=common_pb2.ROLE_RESEARCHER),
                content="x" * (100 * 1024),
            )
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_plaintext_health_port_serves_probes_while_the_service_speaks_tls(pki: Pki, tmp_path: Path) -> None:
    authority = pki.authority("quarry-ca")
    server = settings(tmp_path, pki.issue("scratchpad", authority), str(tmp_path / "quarry-ca.pem"))
    host = await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0", health_address="127.0.0.1:0"), server)
    async with host:
        async with open_channel(f"127.0.0.1:{host.health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as raised:  # only health is there
                await ScratchpadClient(channel).get_thread("anything")
            assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
        async with open_channel(host.address) as plaintext:
            with pytest.raises(grpc.aio.AioRpcError):
                await health_pb2_grpc.HealthStub(plaintext).Check(health_pb2.HealthCheckRequest(), timeout=5)


async def test_a_quiet_stream_outlives_many_keepalive_pings(tmp_path: Path) -> None:
    common = QuarrySettings(data_dir=tmp_path, keepalive_seconds=1)
    host = await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common)
    async with host, open_channel(host.address, limits=ConnectionLimits.from_settings(common)) as channel:
        # A raw stream (no client-side reconnects): a server that refused the pings would end it.
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        await asyncio.sleep(6)  # a dozen pings with no data
        assert not watch.done(), f"the stream ended: {await watch.code()} {await watch.details()}"
        watch.cancel()
