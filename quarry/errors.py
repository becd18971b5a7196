"""One exception tree for domain errors, and their one translation to gRPC status.

Domain code raises these; the server's interceptor (quarry.server) turns them into
a canonical status code with google.rpc.Status details (ErrorInfo, BadRequest).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = [
    "AlreadyExists",
    "DatabaseUnavailable",
    "DeadlineExceeded",
    "ErrorReason",
    "FailedPrecondition",
    "FieldViolation",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "QuarryError",
    "ResourceExhausted",
    "ServiceError",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "answered_violations",
    "internal_status",
    "to_rpc_status",
]

ERROR_DOMAIN = "quarry.dev"


class ErrorReason(enum.StrEnum):
    """Every google.rpc.ErrorInfo.reason Quarry sends; the values are the wire strings."""

    # The defaults, one per status code.
    INTERNAL = "INTERNAL"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    # Any service.
    BEARER_TOKEN_INVALID = "BEARER_TOKEN_INVALID"
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
    DATABASE_DISK_FULL = "DATABASE_DISK_FULL"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    REQUEST_ID_REUSED = "REQUEST_ID_REUSED"
    MESH_CREDENTIAL_INVALID = "MESH_CREDENTIAL_INVALID"
    CALLER_NOT_PERMITTED = "CALLER_NOT_PERMITTED"
    ROLE_NOT_PERMITTED = "ROLE_NOT_PERMITTED"
    SELF_APPROVAL_NOT_ALLOWED = "SELF_APPROVAL_NOT_ALLOWED"
    OBJECTIONS_OPEN = "OBJECTIONS_OPEN"
    # A missing resource, one per resource type NotFound names.
    CAMPAIGN_NOT_FOUND = "CAMPAIGN_NOT_FOUND"
    CONVERSATION_NOT_FOUND = "CONVERSATION_NOT_FOUND"
    DELEGATION_NOT_FOUND = "DELEGATION_NOT_FOUND"
    HOST_NOT_FOUND = "HOST_NOT_FOUND"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    THREAD_NOT_FOUND = "THREAD_NOT_FOUND"
    WORKSPACE_NOT_FOUND = "WORKSPACE_NOT_FOUND"
    # Scratchpad.
    KIND_NOT_PERMITTED_FOR_ROLE = "KIND_NOT_PERMITTED_FOR_ROLE"
    THREAD_EXISTS = "THREAD_EXISTS"
    # Worker.
    TOO_MANY_DELEGATIONS = "TOO_MANY_DELEGATIONS"
    DELEGATION_ID_REUSED = "DELEGATION_ID_REUSED"
    DELEGATION_RUNNING = "DELEGATION_RUNNING"
    MONITOR_NOT_CONFIGURED = "MONITOR_NOT_CONFIGURED"
    # Supervisor.
    TOO_MANY_RUNS = "TOO_MANY_RUNS"
    # Campaigns.
    TOO_MANY_CAMPAIGNS = "TOO_MANY_CAMPAIGNS"
    CAMPAIGN_ENDED = "CAMPAIGN_ENDED"
    CAMPAIGN_LOOP_MISSING = "CAMPAIGN_LOOP_MISSING"
    # Monitor.
    LOG_PATH_NOT_ALLOWED = "LOG_PATH_NOT_ALLOWED"
    JOB_NOT_STARTED = "JOB_NOT_STARTED"
    SBATCH_FAILED = "SBATCH_FAILED"
    LOG_UNREADABLE = "LOG_UNREADABLE"
    MALFORMED_OUTPUT = "MALFORMED_OUTPUT"
    SSH_CONFIG_INVALID = "SSH_CONFIG_INVALID"
    HOST_KEY_UNKNOWN = "HOST_KEY_UNKNOWN"
    SSH_AUTH_FAILED = "SSH_AUTH_FAILED"
    JOB_SUBMISSION_DISABLED = "JOB_SUBMISSION_DISABLED"
    GPUS_BUSY = "GPUS_BUSY"
    GPUS_UNAVAILABLE = "GPUS_UNAVAILABLE"
    SANDBOX_UNAVAILABLE = "SANDBOX_UNAVAILABLE"
    SANDBOX_PATH_HIDDEN = "SANDBOX_PATH_HIDDEN"
    # Monitor workspaces.
    WORKSPACE_ROOT_NOT_ALLOWED = "WORKSPACE_ROOT_NOT_ALLOWED"
    WORKSPACE_ROOT_INVALID = "WORKSPACE_ROOT_INVALID"
    WORKSPACE_PATH_ESCAPES = "WORKSPACE_PATH_ESCAPES"
    WORKSPACE_PATH_PROTECTED = "WORKSPACE_PATH_PROTECTED"
    WORKSPACE_PATCH_FAILED = "WORKSPACE_PATCH_FAILED"
    WORKSPACE_NOT_A_REPO = "WORKSPACE_NOT_A_REPO"
    WORKSPACE_GIT_FAILED = "WORKSPACE_GIT_FAILED"
    WORKSPACE_EXISTS = "WORKSPACE_EXISTS"
    WORKSPACE_WRONG_KIND = "WORKSPACE_WRONG_KIND"
    WORKSPACE_SEARCH_TOO_SLOW = "WORKSPACE_SEARCH_TOO_SLOW"


# The reason NotFound gives for each resource type it is raised for.
_NOT_FOUND_REASONS: dict[str, ErrorReason] = {
    "campaign": ErrorReason.CAMPAIGN_NOT_FOUND,
    "conversation": ErrorReason.CONVERSATION_NOT_FOUND,
    "delegation": ErrorReason.DELEGATION_NOT_FOUND,
    "host": ErrorReason.HOST_NOT_FOUND,
    "job": ErrorReason.JOB_NOT_FOUND,
    "run": ErrorReason.RUN_NOT_FOUND,
    "thread": ErrorReason.THREAD_NOT_FOUND,
    "workspace": ErrorReason.WORKSPACE_NOT_FOUND,
}


@dataclass(frozen=True)
class FieldViolation:
    """A request field that failed validation, named by its proto path (e.g. "sources[2].url")."""

    field: str
    description: str


class QuarryError(Exception):
    """Base of every error Quarry reports on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        reason: ErrorReason | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        # Without a specific reason, the status code's own name: ErrorReason holds one per code.
        self.reason = reason or ErrorReason(self.code.name)
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

    def __init__(
        self,
        violations: Iterable[FieldViolation],
        *,
        message: str | None = None,
        reason: ErrorReason | None = None,
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

    def __init__(self, resource_type: str, resource_name: str, *, field: str | None = None) -> None:
        super().__init__(
            f"{resource_type} {resource_name!r} not found",
            reason=_NOT_FOUND_REASONS.get(resource_type, ErrorReason.NOT_FOUND),
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


class PermissionDenied(QuarryError):
    code = grpc.StatusCode.PERMISSION_DENIED


class FailedPrecondition(QuarryError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(QuarryError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unauthenticated(QuarryError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Unavailable(QuarryError):
    code = grpc.StatusCode.UNAVAILABLE


class DatabaseUnavailable(Unavailable):
    """This process's own database does not answer, or has no room (as opposed to another service's)."""


class DeadlineExceeded(QuarryError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unimplemented(QuarryError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(QuarryError):
    code = grpc.StatusCode.INTERNAL


class ServiceError(QuarryError):
    """A call to another service that failed, as the caller saw it: the status code and details it got.

    The client's side of the tree: a port that calls a service raises this, so its callers handle one
    error tree whether a failure was raised here or answered over the wire."""

    def __init__(
        self, message: str, *, code: grpc.StatusCode = grpc.StatusCode.INTERNAL, reason: ErrorReason | None = None
    ) -> None:
        self.code = code
        super().__init__(message, reason=reason or ErrorReason.__members__.get(code.name, ErrorReason.INTERNAL))

    @classmethod
    def of(cls, error: grpc.aio.AioRpcError) -> Self:
        """The error as answered, with the reason its ErrorInfo names (GPUS_BUSY, say) where it names one."""
        return cls(error.details() or error.code().name, code=error.code(), reason=_answered_reason(error))


def answered_violations(error: grpc.aio.AioRpcError) -> list[FieldViolation]:
    """The field violations of a BadRequest the answer carries; none when it carries none."""
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except ValueError:  # a status whose code or message disagrees with the call's
        return []
    violations: list[FieldViolation] = []
    for detail in status.details if status is not None else ():
        bad_request = error_details_pb2.BadRequest()
        if detail.Unpack(bad_request):
            violations.extend(FieldViolation(v.field, v.description) for v in bad_request.field_violations)
    return violations


def _answered_reason(error: grpc.aio.AioRpcError) -> ErrorReason | None:
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except ValueError:  # a status whose code or message disagrees with the call's
        return None
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return ErrorReason.__members__.get(info.reason)
    return None


# Statuses travel in trailers, which clients cap (8 KiB by default, over which the caller sees
# RESOURCE_EXHAUSTED instead of the error): whatever an error quotes from a request is cut to fit.
MAX_MESSAGE_CHARS = 1024
MAX_DETAIL_CHARS = 256
MAX_FIELD_VIOLATIONS = 10


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def _bounded(detail: any_pb2.Any) -> any_pb2.Any:
    info, bad_request = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    if detail.Unpack(info):
        for key, value in list(info.metadata.items()):
            info.metadata[key] = _clip(value, MAX_DETAIL_CHARS)
        return _pack(info)
    if detail.Unpack(bad_request):
        kept = bad_request.field_violations[:MAX_FIELD_VIOLATIONS]
        return _pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=_clip(v.field, MAX_DETAIL_CHARS), description=_clip(v.description, MAX_DETAIL_CHARS)
                    )
                    for v in kept
                ]
            )
        )
    return detail


def to_rpc_status(error: QuarryError) -> grpc.Status:
    """The one translation from a domain error to a gRPC status with rich details, cut to fit a trailer."""
    status = status_pb2.Status(
        code=getattr(code_pb2, error.code.name),
        message=_clip(error.message, MAX_MESSAGE_CHARS),
        details=[_bounded(detail) for detail in error.details()],
    )
    return rpc_status.to_status(status)


def internal_status(message: str = "internal error") -> grpc.Status:
    """Status for a fault that was not raised on purpose; the cause stays in the server log."""
    return to_rpc_status(Internal(message))
