"""The research plane hands agents only entries they can understand."""

from __future__ import annotations

from quarry.research_plane import ResearchPlane, _readable
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


class Scratchpad:
    """A thread's entries, and the `after_sequence_no` of every read asked for."""

    def __init__(self) -> None:
        self.entries: list[scratchpad_pb2.Entry] = []
        self.asked: list[int] = []

    def commit(self, kind: int) -> None:
        author = common_pb2.Principal(principal_id="someone", role=common_pb2.ROLE_RESEARCHER)
        number = len(self.entries) + 1
        self.entries.append(scratchpad_pb2.Entry(thread_id="t", sequence_no=number, kind=kind, author=author))

    async def read_all(self, thread_id: str, *, after_sequence_no: int = 0) -> list[scratchpad_pb2.Entry]:
        self.asked.append(after_sequence_no)
        return [e for e in self.entries if e.sequence_no > after_sequence_no]


async def test_a_thread_read_again_is_asked_only_for_what_came_after_the_last_read() -> None:
    scratchpad = Scratchpad()
    plane = ResearchPlane(scratchpad)  # type: ignore[arg-type]
    for kind in (scratchpad_pb2.ENTRY_KIND_SEED, 7, scratchpad_pb2.ENTRY_KIND_FINDING):  # 7: a kind unknown here
        scratchpad.commit(kind)
    assert [e.sequence_no for e in await plane.read_all("t")] == [1, 3]
    scratchpad.commit(scratchpad_pb2.ENTRY_KIND_NOTE)
    assert [e.sequence_no for e in await plane.read_all("t")] == [1, 3, 4]
    assert [e.sequence_no for e in await plane.read_all("t", after_sequence_no=2)] == [3, 4]
    assert scratchpad.asked == [0, 3, 4]
