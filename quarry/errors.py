"""One exception tree for domain errors, and their one translation to gRPC status.

Domain code raises these; the server's interceptor (quarry.server) turns them into
a canonical status code with google.rpc.Status details (ErrorInfo, BadRequest).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = [
    "AlreadyExists",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "QuarryError",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "internal_status",
    "to_rpc_status",
]

ERROR_DOMAIN = "quarry.dev"


@dataclass(frozen=True)
class FieldViolation:
    """A request field that failed validation, named by its proto path (e.g. "sources[2].url")."""

    field: str
    description: str


class QuarryError(Exception):
    """Base of every error Quarry reports on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    default_reason = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata = dict(metadata or {})

    def details(self) -> list[any_pb2.Any]:
        return [_pack(error_details_pb2.ErrorInfo(reason=self.reason, domain=ERROR_DOMAIN, metadata=self.metadata))]


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _bad_request(violations: Iterable[FieldViolation]) -> any_pb2.Any:
    return _pack(
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                for v in violations
            ]
        )
    )


class InvalidArgument(QuarryError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = "INVALID_ARGUMENT"

    def __init__(
        self,
        violations: Iterable[FieldViolation],
        *,
        message: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.violations = list(violations)
        if not self.violations:
            raise ValueError("InvalidArgument needs at least one field violation")
        summary = "; ".join(f"{v.field}: {v.description}" for v in self.violations)
        super().__init__(message or f"invalid request: {summary}", reason=reason)

    def details(self) -> list[any_pb2.Any]:
        return [*super().details(), _bad_request(self.violations)]


class NotFound(QuarryError):
    code = grpc.StatusCode.NOT_FOUND
    default_reason = "NOT_FOUND"

    def __init__(self, resource_type: str, resource_name: str, *, field: str | None = None) -> None:
        super().__init__(
            f"{resource_type} {resource_name!r} not found",
            reason=f"{resource_type.upper()}_NOT_FOUND",
            metadata={resource_type: resource_name},
        )
        self.resource_type = resource_type
        self.resource_name = resource_name
        self.field = field

    def details(self) -> list[any_pb2.Any]:
        resource = error_details_pb2.ResourceInfo(resource_type=self.resource_type, resource_name=self.resource_name)
        details = [*super().details(), _pack(resource)]
        if self.field:
            # Name the request field that referred to the missing resource.
            details.append(_bad_request([FieldViolation(self.field, f"no {self.resource_type} with this id")]))
        return details


class AlreadyExists(QuarryError):
    code = grpc.StatusCode.ALREADY_EXISTS
    default_reason = "ALREADY_EXISTS"


class PermissionDenied(QuarryError):
    code = grpc.StatusCode.PERMISSION_DENIED
    default_reason = "PERMISSION_DENIED"


class FailedPrecondition(QuarryError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    default_reason = "FAILED_PRECONDITION"


class ResourceExhausted(QuarryError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_reason = "RESOURCE_EXHAUSTED"


class Unauthenticated(QuarryError):
    code = grpc.StatusCode.UNAUTHENTICATED
    default_reason = "UNAUTHENTICATED"


class Unavailable(QuarryError):
    code = grpc.StatusCode.UNAVAILABLE
    default_reason = "UNAVAILABLE"


class DeadlineExceeded(QuarryError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    default_reason = "DEADLINE_EXCEEDED"


class Unimplemented(QuarryError):
    code = grpc.StatusCode.UNIMPLEMENTED
    default_reason = "UNIMPLEMENTED"


class Internal(QuarryError):
    code = grpc.StatusCode.INTERNAL
    default_reason = "INTERNAL"


def to_rpc_status(error: QuarryError) -> grpc.Status:
    """The one translation from a domain error to a gRPC status with rich details."""
    status = status_pb2.Status(
        code=getattr(code_pb2, error.code.name),
        message=error.message,
        details=error.details(),
    )
    return rpc_status.to_status(status)


def internal_status(message: str = "internal error") -> grpc.Status:
    """Status for a fault that was not raised on purpose; the cause stays in the server log."""
    return to_rpc_status(Internal(message))
