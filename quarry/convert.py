"""Translations between quarry.v1 common messages and kernel types, shared by servicers."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf import timestamp_pb2

from quarry.identity import Role
from quarry.v1 import common_pb2

_ROLE_TO_PROTO: dict[Role, common_pb2.Role.ValueType] = {
    Role.SUPERVISOR: common_pb2.ROLE_SUPERVISOR,
    Role.RESEARCHER: common_pb2.ROLE_RESEARCHER,
    Role.VERIFIER: common_pb2.ROLE_VERIFIER,
}
_ROLE_FROM_PROTO: dict[int, Role] = {number: role for role, number in _ROLE_TO_PROTO.items()}


def role_from_proto(value: int) -> Role | None:
    """None for ROLE_UNSPECIFIED and for numbers this build does not know."""
    return _ROLE_FROM_PROTO.get(value)


def role_to_proto(role: Role) -> common_pb2.Role.ValueType:
    return _ROLE_TO_PROTO[role]


def timestamp(value: datetime) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(value.astimezone(UTC))
    return message
