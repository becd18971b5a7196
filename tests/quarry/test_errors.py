from __future__ import annotations

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2

from quarry import errors
from quarry.errors import (
    ErrorReason,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QuarryError,
    to_rpc_status,
)
from quarry.server import ServiceRegistration, create_server
from tests.rpc import violations


def decode(status: grpc.Status) -> status_pb2.Status:
    ((key, value),) = status.trailing_metadata
    assert key == "grpc-status-details-bin"
    return status_pb2.Status.FromString(value)


def test_invalid_argument_carries_error_info_and_every_violation() -> None:
    error = InvalidArgument([FieldViolation("content", "empty"), FieldViolation("kind", "unknown")])
    status = to_rpc_status(error)
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT
    details = decode(status)
    assert details.code == code_pb2.INVALID_ARGUMENT
    bad_request = error_details_pb2.BadRequest()
    assert details.details[1].Unpack(bad_request)
    assert [(v.field, v.description) for v in bad_request.field_violations] == [
        ("content", "empty"),
        ("kind", "unknown"),
    ]
    info = error_details_pb2.ErrorInfo()
    assert details.details[0].Unpack(info)
    assert info.domain == "quarry.dev"


def test_not_found_names_the_resource_and_field() -> None:
    details = decode(to_rpc_status(NotFound("thread", "t-1", field="thread_id")))
    info, resource, bad_request = (
        error_details_pb2.ErrorInfo(),
        error_details_pb2.ResourceInfo(),
        error_details_pb2.BadRequest(),
    )
    assert details.details[0].Unpack(info) and info.reason == "THREAD_NOT_FOUND"
    assert details.details[1].Unpack(resource) and resource.resource_name == "t-1"
    assert details.details[2].Unpack(bad_request) and bad_request.field_violations[0].field == "thread_id"


def test_permission_denied_keeps_its_reason_and_metadata() -> None:
    error = PermissionDenied("no", reason=ErrorReason.KIND_NOT_PERMITTED_FOR_ROLE, metadata={"role": "researcher"})
    status = to_rpc_status(error)
    assert status.code == grpc.StatusCode.PERMISSION_DENIED
    info = error_details_pb2.ErrorInfo()
    assert decode(status).details[0].Unpack(info)
    assert info.reason == "KIND_NOT_PERMITTED_FOR_ROLE" and info.metadata["role"] == "researcher"


# InvalidArgument and NotFound take no message; the tests above cover their reasons.
_PLAIN_ERRORS = [
    error
    for error in vars(errors).values()
    if isinstance(error, type) and issubclass(error, QuarryError) and error not in (InvalidArgument, NotFound)
]


@pytest.mark.parametrize("error_class", _PLAIN_ERRORS)
def test_an_error_without_a_reason_gives_its_status_code_name(error_class: type[QuarryError]) -> None:
    assert error_class("boom").reason == error_class.code.name


async def test_an_error_quoting_a_huge_request_still_reaches_the_client_whole() -> None:
    """Trailers over the client's cap would turn any error into RESOURCE_EXHAUSTED: what it quotes is cut."""
    huge = "x" * 100_000

    async def refuse(request: bytes, context: object) -> bytes:
        raise InvalidArgument(
            [FieldViolation(f"labels[{i}]{huge}", f"bad: {huge}") for i in range(50)],
            message=f"refused {huge}",
        )

    def register(server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(refuse)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", {"Refuse": handler})])

    bound, port = create_server("127.0.0.1:0", [ServiceRegistration("test.Echo", register)])
    await bound.server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await channel.unary_unary("/test.Echo/Refuse")(b"", timeout=10)
    finally:
        await bound.server.stop(None)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith("refused xxx") and len(raised.value.details()) < 1100
    assert len(violations(raised.value)) == 10
