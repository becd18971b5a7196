"""The one place quarry.v1 messages meet kernel types: enums, usage, durations, timestamps and labels.

Servicers translate with these; a service's own enum gets its two-way map from EnumMap.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from google.protobuf import duration_pb2, timestamp_pb2

from quarry.agent.usage import Usage
from quarry.identity import Role
from quarry.v1 import common_pb2, scratchpad_pb2
from quarry.vocabulary import DelegationErrorCode, EntryKind

if TYPE_CHECKING:
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

__all__ = [
    "DELEGATION_ERROR_CODES",
    "ENTRY_KINDS",
    "ROLES",
    "EnumMap",
    "duration",
    "duration_seconds",
    "enum_label",
    "timestamp",
    "usage_from_proto",
    "usage_to_proto",
]

_Member = TypeVar("_Member", bound=enum.Enum)
_Number = TypeVar("_Number", bound=int)


class EnumMap(Generic[_Member, _Number]):
    """A two-way map between a domain enum and a proto enum, from one table covering every member."""

    def __init__(self, table: Mapping[_Member, _Number]) -> None:
        self._to_proto = dict(table)
        self._from_proto: dict[int, _Member] = {number: member for member, number in table.items()}
        domain = type(next(iter(table)))
        missing = [member.name for member in domain if member not in table]
        if missing or len(self._from_proto) != len(table):
            raise ValueError(f"{domain.__name__} needs one distinct proto number per member; missing: {missing}")

    def to_proto(self, member: _Member) -> _Number:
        return self._to_proto[member]

    def from_proto(self, number: int) -> _Member | None:
        """None for the UNSPECIFIED value and for numbers this build does not know."""
        return self._from_proto.get(number)

    def known(self, numbers: Iterable[int]) -> list[_Member]:
        """The members among `numbers`, unknown ones dropped (for filters, where they match nothing)."""
        return [member for member in map(self.from_proto, numbers) if member is not None]


ROLES: EnumMap[Role, common_pb2.Role.ValueType] = EnumMap(
    {
        Role.SUPERVISOR: common_pb2.ROLE_SUPERVISOR,
        Role.RESEARCHER: common_pb2.ROLE_RESEARCHER,
        Role.VERIFIER: common_pb2.ROLE_VERIFIER,
    }
)

ENTRY_KINDS: EnumMap[EntryKind, scratchpad_pb2.EntryKind.ValueType] = EnumMap(
    {
        EntryKind.SEED: scratchpad_pb2.ENTRY_KIND_SEED,
        EntryKind.FINDING: scratchpad_pb2.ENTRY_KIND_FINDING,
        EntryKind.MARKER: scratchpad_pb2.ENTRY_KIND_MARKER,
        EntryKind.ACKNOWLEDGEMENT: scratchpad_pb2.ENTRY_KIND_ACKNOWLEDGEMENT,
        EntryKind.NOTE: scratchpad_pb2.ENTRY_KIND_NOTE,
        EntryKind.VERDICT: scratchpad_pb2.ENTRY_KIND_VERDICT,
    }
)

DELEGATION_ERROR_CODES: EnumMap[DelegationErrorCode, common_pb2.DelegationErrorCode.ValueType] = EnumMap(
    {code: common_pb2.DelegationErrorCode.Value(f"DELEGATION_ERROR_CODE_{code.name}") for code in DelegationErrorCode}
)


def enum_label(enum_type: _EnumTypeWrapper[Any], number: int) -> str:
    """A proto enum value as a lowercase label without its prefix: JOB_STATE_TIMED_OUT -> "timed_out".

    Raises ValueError for a number the enum does not define, as the enum's Name does.
    """
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum_type.DESCRIPTOR.name).upper() + "_"
    return enum_type.Name(number).removeprefix(prefix).lower()


def usage_to_proto(usage: Usage) -> common_pb2.Usage:
    return common_pb2.Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        model_calls=usage.model_calls,
        tool_calls=usage.tool_calls,
    )


def usage_from_proto(message: common_pb2.Usage) -> Usage:
    return Usage(
        input_tokens=message.input_tokens,
        output_tokens=message.output_tokens,
        model_calls=message.model_calls,
        tool_calls=message.tool_calls,
    )


def duration_seconds(value: duration_pb2.Duration) -> float:
    # Computed by hand: ToTimedelta overflows on absurd values, which validation should refuse.
    return value.seconds + value.nanos / 1e9


def duration(seconds: float) -> duration_pb2.Duration:
    message = duration_pb2.Duration()
    message.FromNanoseconds(round(seconds * 1e9))
    return message


def timestamp(value: datetime) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(value.astimezone(UTC))
    return message
