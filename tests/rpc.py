"""Reading gRPC errors in tests: status code, google.rpc details (field violations, reason)."""

from __future__ import annotations

from collections.abc import Awaitable

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def violations(error: grpc.aio.AioRpcError) -> dict[str, str]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "error carries no google.rpc.Status details"
    found: dict[str, str] = {}
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            found.update({v.field: v.description for v in bad_request.field_violations})
    return found


def error_reason(error: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason
    raise AssertionError("no ErrorInfo detail")


async def expect_error(call: Awaitable[object], code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == code, raised.value.details()
    return raised.value
