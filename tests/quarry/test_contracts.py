"""Pins properties of the quarry.v1 contracts that buf does not check."""

from __future__ import annotations

from google.protobuf.descriptor import FileDescriptor

from quarry.convert import DELEGATION_ERROR_CODES, ENTRY_KINDS
from quarry.errors import ErrorReason
from quarry.v1 import common_pb2, scratchpad_pb2, supervisor_pb2
from quarry.vocabulary import DelegationErrorCode, EntryKind

# Internal service contracts: a client of the public API must not need them.
INTERNAL_FILES = {"quarry/v1/worker.proto", "quarry/v1/monitor.proto"}


def imported_files(file: FileDescriptor) -> set[str]:
    """Every file `file` imports, directly or through another import."""
    found: set[str] = set()
    pending = list(file.dependencies)
    while pending:
        dependency = pending.pop()
        if dependency.name not in found:
            found.add(dependency.name)
            pending.extend(dependency.dependencies)
    return found


def test_the_public_contract_imports_no_internal_service_contract() -> None:
    assert not imported_files(supervisor_pb2.DESCRIPTOR) & INTERNAL_FILES


def test_the_documented_error_reasons_are_exactly_the_ones_the_services_send() -> None:
    documented = {
        name.removeprefix("ERROR_REASON_")
        for name in common_pb2.ErrorReason.DESCRIPTOR.values_by_name
        if name != "ERROR_REASON_UNSPECIFIED"
    }
    assert documented == {reason.value for reason in ErrorReason}


def test_every_shared_enum_has_one_proto_value_per_member() -> None:
    # EnumMap refuses an incomplete table at import; this pins that the shared maps cover the contracts too.
    assert {DELEGATION_ERROR_CODES.to_proto(code) for code in DelegationErrorCode} == {
        number for number in common_pb2.DelegationErrorCode.values() if number
    }
    assert {ENTRY_KINDS.to_proto(kind) for kind in EntryKind} == {
        number for number in scratchpad_pb2.EntryKind.values() if number
    }
