"""The one proto <-> domain converter: enum maps, labels, usage, durations, timestamps."""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import duration_pb2

from quarry.agent.usage import Usage
from quarry.convert import (
    ENTRY_KINDS,
    ROLES,
    TIERS,
    EnumMap,
    duration,
    duration_seconds,
    enum_label,
    timestamp,
    usage_from_proto,
    usage_to_proto,
)
from quarry.errors import FieldViolation, InvalidArgument
from quarry.identity import Role
from quarry.v1 import common_pb2, monitor_pb2, scratchpad_pb2
from quarry.vocabulary import EntryKind, Tier


def test_enum_maps_cover_every_member_both_ways() -> None:
    for member in Role:
        assert ROLES.from_proto(ROLES.to_proto(member)) is member
    for kind in EntryKind:
        assert ENTRY_KINDS.from_proto(ENTRY_KINDS.to_proto(kind)) is kind
    assert ROLES.to_proto(Role.VERIFIER) == common_pb2.ROLE_VERIFIER


def test_unspecified_and_unknown_numbers_map_to_none() -> None:
    assert ROLES.from_proto(common_pb2.ROLE_UNSPECIFIED) is None
    assert ENTRY_KINDS.from_proto(999) is None
    kinds = [scratchpad_pb2.ENTRY_KIND_NOTE, 999, scratchpad_pb2.ENTRY_KIND_UNSPECIFIED, scratchpad_pb2.ENTRY_KIND_SEED]
    assert ENTRY_KINDS.known(kinds) == [EntryKind.NOTE, EntryKind.SEED]


def test_a_requested_number_is_a_member_none_when_unset_and_refused_when_unknown() -> None:
    assert TIERS.requested(common_pb2.MODEL_TIER_SUPERVISOR, field="tier", enum_name="ModelTier") is Tier.SUPERVISOR
    assert TIERS.requested(common_pb2.MODEL_TIER_UNSPECIFIED, field="tier", enum_name="ModelTier") is None
    with pytest.raises(InvalidArgument) as raised:
        TIERS.requested(7, field="tier", enum_name="ModelTier")
    assert raised.value.violations == [FieldViolation("tier", "7 is not a ModelTier this server knows")]


def test_an_incomplete_or_ambiguous_table_is_refused() -> None:
    class Colour(enum.Enum):
        RED = 1
        BLUE = 2

    with pytest.raises(ValueError, match="BLUE"):
        EnumMap({Colour.RED: 1})
    with pytest.raises(ValueError, match="distinct"):
        EnumMap({Colour.RED: 1, Colour.BLUE: 1})


def test_enum_label_drops_the_prefix_and_lowercases() -> None:
    assert enum_label(monitor_pb2.JobState, monitor_pb2.JOB_STATE_TIMED_OUT) == "timed_out"
    assert enum_label(common_pb2.Role, common_pb2.ROLE_RESEARCHER) == "researcher"
    code = common_pb2.DELEGATION_ERROR_CODE_TOKEN_BUDGET_EXHAUSTED
    assert enum_label(common_pb2.DelegationErrorCode, code) == "token_budget_exhausted"
    with pytest.raises(ValueError):
        enum_label(common_pb2.Role, 999)


def test_usage_round_trips_through_proto() -> None:
    usage = Usage(input_tokens=40, output_tokens=8, model_calls=2, tool_calls=3)
    message = usage_to_proto(usage)
    assert (message.input_tokens, message.output_tokens, message.model_calls, message.tool_calls) == (40, 8, 2, 3)
    assert usage_from_proto(message) == usage


def test_durations_in_seconds() -> None:
    assert duration_seconds(duration_pb2.Duration(seconds=2, nanos=500_000_000)) == 2.5
    assert duration(1.25) == duration_pb2.Duration(seconds=1, nanos=250_000_000)
    assert duration_seconds(duration(600)) == 600.0


def test_timestamps_are_utc() -> None:
    moment = datetime(2025, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert timestamp(moment).ToDatetime(tzinfo=UTC) == datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
