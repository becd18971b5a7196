"""The research plane hands agents only entries they can understand."""

from __future__ import annotations

from quarry.research_plane import _readable
from quarry.v1 import common_pb2, scratchpad_pb2
from quarry.vocabulary import EntryKind


def entry(kind: int, role: int = common_pb2.ROLE_RESEARCHER) -> scratchpad_pb2.Entry:
    author = common_pb2.Principal(principal_id="someone", role=role)
    return scratchpad_pb2.Entry(thread_id="t", sequence_no=3, kind=kind, author=author, content="c")


def test_an_entry_of_a_known_kind_reads_as_the_domain_entry() -> None:
    read = _readable(entry(scratchpad_pb2.ENTRY_KIND_FINDING))
    assert read is not None and read.kind is EntryKind.FINDING and read.sequence_no == 3


def test_an_entry_of_a_kind_or_role_this_build_does_not_know_is_skipped_not_fatal() -> None:
    assert _readable(entry(7)) is None  # the retired synthesis kind
    assert _readable(entry(scratchpad_pb2.ENTRY_KIND_NOTE, role=42)) is None
