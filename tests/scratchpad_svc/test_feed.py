"""What a watcher takes from delivered commits, and what a NOTIFY payload carries between replicas."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from quarry.identity import Principal, Role
from quarry.notify import CommitFeed
from quarry.vocabulary import Entry, EntryKind, Source
from scratchpad_svc.feed import PAYLOAD_LIMIT, Committed, Payloads, continue_watch

NOW = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def entry(sequence_no: int, content: str = "a fact", thread_id: str = "t") -> Entry:
    return Entry(
        thread_id=thread_id,
        sequence_no=sequence_no,
        request_id=f"r-{sequence_no}",
        kind=EntryKind.FINDING,
        author=Principal("worker-a", Role.RESEARCHER),
        content=content,
        sources=(Source(url="https://example.org/a", title="A", excerpt="fact"),),
        create_time=NOW,
    )


def commit(first: int, last: int) -> Committed:
    return Committed(last=last, count=last - first + 1, entries=tuple(entry(n) for n in range(first, last + 1)))


def numbers(entries: list[Entry]) -> list[int]:
    return [item.sequence_no for item in entries]


def test_batches_that_continue_from_the_last_entry_are_delivered_without_a_read() -> None:
    delivered, after, read = continue_watch(3, [commit(4, 5), commit(6, 6), commit(7, 9)])
    assert (numbers(delivered), after, read) == ([4, 5, 6, 7, 8, 9], 9, False)


def test_a_batch_already_seen_is_skipped_and_an_overlapping_one_yields_only_what_is_new() -> None:
    delivered, after, read = continue_watch(5, [commit(2, 3), commit(4, 7)])
    assert (numbers(delivered), after, read) == ([6, 7], 7, False)


def test_a_batch_that_skips_ahead_sends_the_watcher_back_to_the_rows() -> None:
    # Another replica's commit (6) has not been delivered yet: deliver what continues, then read.
    delivered, after, read = continue_watch(3, [commit(4, 5), commit(7, 8), commit(9, 9)])
    assert (numbers(delivered), after, read) == ([4, 5], 5, True)


def test_a_bare_wake_up_sends_the_watcher_back_to_the_rows() -> None:
    assert continue_watch(3, [None, commit(4, 4)]) == ([], 3, True)


def test_a_payload_that_carried_only_the_first_entries_delivers_those_then_reads() -> None:
    partial = Committed(last=9, count=4, entries=(entry(6), entry(7)))
    delivered, after, read = continue_watch(5, [partial, commit(10, 10)])
    assert (numbers(delivered), after, read) == ([6, 7], 7, True)


def test_payload_round_trips_every_field_between_replicas() -> None:
    sender, receiver = Payloads(scope="s1", origin="replica-a"), Payloads(scope="s1", origin="replica-b")
    sent = [entry(1, "ünïcode — kept"), entry(2)]
    decoded = receiver.decode(sender.payload("t", sent, last=12))
    assert decoded is not None
    thread_id, batch = decoded
    assert thread_id == "t" and batch is not None
    assert (batch.first, batch.last) == (11, 12)
    # Numbered from the last sequence number the committing statement spliced in.
    assert list(batch.entries) == [dataclasses.replace(item, sequence_no=11 + index) for index, item in enumerate(sent)]


def test_own_and_other_scopes_payloads_are_ignored_and_a_bare_key_is_a_wake_up() -> None:
    payloads = Payloads(scope="s1", origin="replica-a")
    own = payloads.payload("t", [entry(1)], last=1)
    assert payloads.decode(own) is None
    other_deployment = Payloads(scope="s2", origin="replica-c").payload("t", [entry(1)], last=1)
    assert payloads.decode(other_deployment) is None
    assert payloads.decode("t") == ("t", None)


def test_entries_that_do_not_fit_a_payload_are_left_out_and_it_stays_under_the_limit() -> None:
    sender, receiver = Payloads(scope="s", origin="a"), Payloads(scope="s", origin="b")
    # Multi-byte text: the limit is in bytes. Two of these fit, the third does not.
    entries = [entry(n, "é" * 1500) for n in range(1, 4)]
    payload = sender.payload("t", entries, last=10**18)
    assert len(payload.encode()) < 8000
    decoded = receiver.decode(payload)
    assert decoded is not None and decoded[1] is not None
    batch = decoded[1]
    assert (batch.count, len(batch.entries), batch.first) == (3, 2, 10**18 - 2)
    huge = sender.payload("t", [entry(1, "x" * PAYLOAD_LIMIT)], last=1)
    decoded = receiver.decode(huge)
    assert decoded is not None and decoded[1] == Committed(last=1, count=1, entries=())


async def test_a_follower_too_far_behind_is_told_to_read_instead_of_holding_more() -> None:
    feed = CommitFeed(Payloads(scope="s", origin="a").decode, backlog=3)
    subscription = feed.subscribe("t")
    for number in range(1, 6):
        feed.publish("t", commit(number, number))
    assert await subscription.take(1) == [None, commit(5, 5)]
    assert await subscription.take(0.01) == []


async def test_a_payload_that_is_not_a_commit_is_ignored() -> None:
    feed = CommitFeed(Payloads(scope="s", origin="a").decode)
    subscription = feed.subscribe("t")
    feed.relay('{"s": "s", "o": "b"')
    feed.relay('{"s": "s", "o": "b", "t": "t"}')
    feed.relay(Payloads(scope="s", origin="b").payload("t", [entry(1)], last=1))
    assert await subscription.take(1) == [commit(1, 1)]
