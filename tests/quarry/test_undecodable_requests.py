"""Bytes that are not a request message: INVALID_ARGUMENT on every method of every service, no traceback
in the log, and a caller without the bearer token is refused before its body is even decoded.
Also the health service's List method, which grpc's own servicer leaves unimplemented."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from quarry.security import bearer_metadata
from quarry.v1 import campaign_pb2, diagnostics_pb2, monitor_pb2, scratchpad_pb2, supervisor_pb2, worker_pb2
from tests.quarry.every_service import CAMPAIGN, MONITOR, SCRATCHPAD, SUPERVISOR, WORKER, Services, every_service

# A length-delimited field whose length is a broken varint: no message type parses it.
GARBAGE = b"\x0a\xff\xff\xff\xff"
TOKEN = "s3cret"
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
DIAGNOSTICS = diagnostics_pb2.DESCRIPTOR.services_by_name["DiagnosticsService"].full_name
DESCRIPTORS = {
    SCRATCHPAD: scratchpad_pb2.DESCRIPTOR.services_by_name["ScratchpadService"],
    WORKER: worker_pb2.DESCRIPTOR.services_by_name["WorkerService"],
    SUPERVISOR: supervisor_pb2.DESCRIPTOR.services_by_name["SupervisorService"],
    CAMPAIGN: campaign_pb2.DESCRIPTOR.services_by_name["CampaignService"],
    MONITOR: monitor_pb2.DESCRIPTOR.services_by_name["MonitorService"],
    HEALTH: health_pb2.DESCRIPTOR.services_by_name["Health"],
    DIAGNOSTICS: diagnostics_pb2.DESCRIPTOR.services_by_name["DiagnosticsService"],
}


@pytest.fixture
async def services(tmp_path: Path) -> AsyncIterator[Services]:
    async with every_service(tmp_path, supervisor_token=TOKEN) as services:
        yield services


def _identity(data: bytes) -> bytes:
    return data


def _corrupt(_message: Descriptor) -> bytes | None:
    return GARBAGE


def _not_utf8(message: Descriptor) -> bytes | None:
    """Valid wire format whose first string field is not UTF-8 (None: the message has no string field)."""
    string = next((field for field in message.fields if field.type == FieldDescriptor.TYPE_STRING), None)
    if string is None:
        return None
    tag = string.number << 3 | 2
    assert tag < 0x80, "a one-byte tag keeps this simple"
    return bytes([tag]) + b"\x02\xc3\x28"


async def _send_raw(
    address: str, method: str, body: bytes, *, streaming: bool, metadata: tuple[tuple[str, str], ...] = ()
) -> grpc.StatusCode:
    """Sends `body` as it is (no serialization) and returns the status the server answered."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            if streaming:
                call = channel.unary_stream(method, request_serializer=_identity, response_deserializer=_identity)(
                    body, metadata=metadata, timeout=10
                )
                async for _ in call:
                    pass
            else:
                await channel.unary_unary(method, request_serializer=_identity, response_deserializer=_identity)(
                    body, metadata=metadata, timeout=10
                )
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


async def test_the_refusal_names_the_problem(services: Services) -> None:
    async with grpc.aio.insecure_channel(services.addresses[SCRATCHPAD]) as channel:
        append = channel.unary_unary(
            f"/{SCRATCHPAD}/Append", request_serializer=_identity, response_deserializer=_identity
        )
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await append(GARBAGE, metadata=services.metadata(SCRATCHPAD), timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == f"the request body is not a valid request message for /{SCRATCHPAD}/Append"


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{record.name}: {record.getMessage()}" for record in caplog.records if record.levelno >= logging.ERROR]


@pytest.mark.parametrize("body_for", [_corrupt, _not_utf8], ids=["corrupt", "not-utf8"])
async def test_undecodable_bodies_are_invalid_argument_on_every_method_without_a_traceback(
    services: Services, caplog: pytest.LogCaptureFixture, body_for: Callable[[Descriptor], bytes | None]
) -> None:
    caplog.set_level(logging.DEBUG)
    answered = {}
    for service, descriptor in DESCRIPTORS.items():
        address = services.addresses.get(service, services.addresses[SCRATCHPAD])
        metadata = services.metadata(service) if service not in (HEALTH, DIAGNOSTICS) else ()
        for method in descriptor.methods:
            body = body_for(method.input_type)
            if body is None:
                continue
            name = f"/{service}/{method.name}"
            answered[name] = await _send_raw(address, name, body, streaming=method.server_streaming, metadata=metadata)
    assert answered == dict.fromkeys(answered, grpc.StatusCode.INVALID_ARGUMENT)
    assert _errors(caplog) == []


async def test_undecodable_body_on_reflection_is_invalid_argument(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with grpc.aio.insecure_channel(services.addresses[SCRATCHPAD]) as channel:
        call = channel.stream_stream(
            f"/{reflection.SERVICE_NAME}/ServerReflectionInfo",
            request_serializer=_identity,
            response_deserializer=_identity,
        )(timeout=10)
        await call.write(GARBAGE)
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in call:
                pass
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _errors(caplog) == []


async def test_a_caller_without_the_token_is_refused_before_its_body_is_decoded(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for service in (SUPERVISOR, CAMPAIGN, SCRATCHPAD, WORKER, MONITOR):
        for method in DESCRIPTORS[service].methods:
            name = f"/{service}/{method.name}"
            for metadata in [(), bearer_metadata("wrong")]:
                code = await _send_raw(
                    services.addresses[service], name, GARBAGE, streaming=method.server_streaming, metadata=metadata
                )
                assert code == grpc.StatusCode.UNAUTHENTICATED, (name, metadata)
    assert _errors(caplog) == []


async def test_health_list_names_every_service_and_its_status(services: Services) -> None:
    for address in set(services.addresses.values()):
        async with grpc.aio.insecure_channel(address) as channel:
            response = await health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=10)
        statuses = {name: status.status for name, status in response.statuses.items()}
        # The supervisor serves campaigns beside runs: every service at the address is listed.
        served_here = [name for name, at in services.addresses.items() if at == address]
        assert statuses == dict.fromkeys(["", *served_here], health_pb2.HealthCheckResponse.SERVING)
