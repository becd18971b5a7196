"""Append, Read and Watch semantics over real gRPC, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from quarry.clients.scratchpad import ScratchpadClient
from quarry.server import ServiceHost
from quarry.v1 import scratchpad_pb2, scratchpad_pb2_grpc
from tests.scratchpad_svc.conftest import SUPERVISOR, finding

Stub = scratchpad_pb2_grpc.ScratchpadServiceStub
MakeThread = Callable[[], Awaitable[str]]


async def test_concurrent_retries_of_one_request_id_create_one_entry(stub: Stub, make_thread: MakeThread) -> None:
    thread_id = await make_thread()
    await stub.Append(finding(thread_id, "before"))
    responses = await asyncio.gather(*(stub.Append(finding(thread_id, "same-request")) for _ in range(40)))
    sequence_numbers = {response.entry.sequence_no for response in responses}
    assert sequence_numbers == {2}
    assert sum(not response.replayed for response in responses) == 1
    # Retries after the commit take the stored path and still return the original.
    later = await asyncio.gather(*(stub.Append(finding(thread_id, "same-request")) for _ in range(10)))
    assert all(response.replayed and response.entry == responses[0].entry for response in later)
    page = await stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id))
    assert [entry.request_id for entry in page.entries] == ["before", "same-request"]
    assert page.last_sequence_no == 2


async def test_batch_mixing_new_and_repeated_request_ids_stays_gap_free(stub: Stub, make_thread: MakeThread) -> None:
    thread_id = await make_thread()
    await stub.Append(finding(thread_id, "old"))
    requests = [finding(thread_id, request_id) for request_id in ["a", "old", "b", "a", "c", "old"]]
    responses = await asyncio.gather(*(stub.Append(request) for request in requests))
    assert responses[0].entry == responses[3].entry and responses[1].entry == responses[5].entry
    by_request = {r.entry.request_id: r.entry.sequence_no for r in responses}
    assert by_request["old"] == 1
    assert sorted({by_request[k] for k in "abc"}) == [2, 3, 4]
    page = await stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id))
    assert [entry.sequence_no for entry in page.entries] == [1, 2, 3, 4]


async def test_concurrent_appends_beyond_one_batch_are_gap_free(stub: Stub, make_thread: MakeThread) -> None:
    thread_id = await make_thread()
    responses = await asyncio.gather(*(stub.Append(finding(thread_id, f"r-{i}")) for i in range(30)))
    assert sorted(r.entry.sequence_no for r in responses) == list(range(1, 31))
    page = await stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id))
    assert [e.sequence_no for e in page.entries] == list(range(1, 31))
    assert {e.request_id for e in page.entries} == {f"r-{i}" for i in range(30)}


async def test_entry_round_trips_every_field(stub: Stub, make_thread: MakeThread) -> None:
    thread_id = await make_thread()
    request = finding(thread_id, "r-1", content="The Eiffel Tower is 330 m tall — ünïcode kept.")
    appended = (await stub.Append(request)).entry
    assert appended.thread_id == thread_id
    assert appended.sequence_no == 1
    assert appended.kind == request.kind
    assert appended.author == request.author
    assert appended.content == request.content
    assert list(appended.sources) == list(request.sources)
    assert appended.request_id == "r-1"
    assert appended.create_time.seconds > 0
    stored = (await stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id))).entries[0]
    assert stored == appended


async def test_read_pages_from_a_sequence_number(stub: Stub, make_thread: MakeThread) -> None:
    thread_id = await make_thread()
    for index in range(7):
        await stub.Append(finding(thread_id, f"r-{index}"))
    seen: list[int] = []
    request = scratchpad_pb2.ReadRequest(thread_id=thread_id, after_sequence_no=2, page_size=2)
    for _ in range(10):
        page = await stub.Read(request)
        seen.extend(entry.sequence_no for entry in page.entries)
        assert page.last_sequence_no == 7
        if not page.next_page_token:
            break
        request = scratchpad_pb2.ReadRequest(thread_id=thread_id, page_size=2, page_token=page.next_page_token)
    assert seen == [3, 4, 5, 6, 7]


async def test_read_filters_by_kind(stub: Stub, make_thread: MakeThread) -> None:
    thread_id = await make_thread()
    await stub.Append(finding(thread_id, "seed", kind=scratchpad_pb2.ENTRY_KIND_SEED, author=SUPERVISOR))
    await stub.Append(finding(thread_id, "f1"))
    await stub.Append(finding(thread_id, "note", kind=scratchpad_pb2.ENTRY_KIND_NOTE))
    await stub.Append(finding(thread_id, "f2"))
    page = await stub.Read(
        scratchpad_pb2.ReadRequest(thread_id=thread_id, kinds=[scratchpad_pb2.ENTRY_KIND_FINDING], page_size=1)
    )
    findings = list(page.entries)
    page = await stub.Read(
        scratchpad_pb2.ReadRequest(
            thread_id=thread_id, kinds=[scratchpad_pb2.ENTRY_KIND_FINDING], page_token=page.next_page_token
        )
    )
    findings += list(page.entries)
    assert [entry.request_id for entry in findings] == ["f1", "f2"]
    # A filter of kinds this server does not know (a retired one, a newer client's) matches nothing.
    unknown = await stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id, kinds=[7, 99]))
    assert list(unknown.entries) == [] and unknown.last_sequence_no == 4


async def test_watch_delivers_backlog_then_live_commits_and_resumes(
    client: ScratchpadClient, stub: Stub, make_thread: MakeThread
) -> None:
    thread_id = await make_thread()
    for index in range(3):
        await stub.Append(finding(thread_id, f"old-{index}"))
    call = stub.Watch(scratchpad_pb2.WatchRequest(thread_id=thread_id, after_sequence_no=1))
    await call.initial_metadata()
    received = [(await call.read()).entry.sequence_no for _ in range(2)]
    assert received == [2, 3]
    await stub.Append(finding(thread_id, "live"))
    live = await asyncio.wait_for(call.read(), 5)
    assert live.entry.request_id == "live" and live.entry.sequence_no == 4
    call.cancel()
    # Resume from any sequence number.
    resumed = client.watch(thread_id, after_sequence_no=2)
    assert [(await anext(resumed)).sequence_no for _ in range(2)] == [3, 4]
    await resumed.aclose()


async def test_watch_with_kind_filter_skips_other_kinds(stub: Stub, make_thread: MakeThread) -> None:
    thread_id = await make_thread()
    call = stub.Watch(scratchpad_pb2.WatchRequest(thread_id=thread_id, kinds=[scratchpad_pb2.ENTRY_KIND_NOTE]))
    await call.initial_metadata()
    await stub.Append(finding(thread_id, "f1"))
    await stub.Append(finding(thread_id, "n1", kind=scratchpad_pb2.ENTRY_KIND_NOTE))
    response = await asyncio.wait_for(call.read(), 5)
    assert response.entry.request_id == "n1"
    call.cancel()


async def test_shutdown_ends_watch_with_unavailable(
    scratchpad_host: ServiceHost, stub: Stub, make_thread: MakeThread
) -> None:
    thread_id = await make_thread()
    call = stub.Watch(scratchpad_pb2.WatchRequest(thread_id=thread_id))
    await call.initial_metadata()
    await scratchpad_host.shutdown()
    try:
        await asyncio.wait_for(call.read(), 10)
        raise AssertionError("the watch should have ended")
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.UNAVAILABLE
