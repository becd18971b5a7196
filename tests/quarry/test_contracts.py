"""Pins properties of the quarry.v1 contracts that buf does not check."""

from __future__ import annotations

from google.protobuf.descriptor import FileDescriptor

from quarry.v1 import supervisor_pb2

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
