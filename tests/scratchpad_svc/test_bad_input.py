"""Every bad Append, Read, Watch and CreateThread gets its status code and names its field."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable

import grpc
import pytest

from quarry.v1 import common_pb2, scratchpad_pb2, scratchpad_pb2_grpc
from tests.rpc import error_reason, expect_error, violations
from tests.scratchpad_svc.conftest import MAX_CONTENT_BYTES, MAX_SOURCES, RESEARCHER, finding

Stub = scratchpad_pb2_grpc.ScratchpadServiceStub


def encode(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


async def assert_nothing_written(stub: Stub, thread_id: str) -> None:
    page = await stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id))
    assert page.last_sequence_no == 0
    assert list(page.entries) == []


BAD_APPENDS: list[tuple[str, dict[str, object], str]] = [
    ("empty content", {"content": ""}, "content"),
    ("blank content", {"content": "   \n"}, "content"),
    ("oversized content", {"content": "x" * (MAX_CONTENT_BYTES + 1)}, "content"),
    ("oversized multibyte content", {"content": "é" * (MAX_CONTENT_BYTES // 2 + 1)}, "content"),
    ("NUL in content", {"content": "before\x00after"}, "content"),
    ("NUL in excerpt", {"sources": [common_pb2.Source(url="https://a.b", excerpt="x\x00")]}, "sources[0].excerpt"),
    ("unspecified kind", {"kind": scratchpad_pb2.ENTRY_KIND_UNSPECIFIED}, "kind"),
    ("unknown kind", {"kind": 999}, "kind"),
    ("unspecified role", {"author": common_pb2.Principal(principal_id="w")}, "author.role"),
    ("unknown role", {"author": common_pb2.Principal(principal_id="w", role=77)}, "author.role"),  # type: ignore[arg-type]
    ("missing principal", {"author": common_pb2.Principal(role=common_pb2.ROLE_RESEARCHER)}, "author.principal_id"),
    ("missing request_id", {"request_id": ""}, "request_id"),
    ("request_id with spaces", {"request_id": "has space"}, "request_id"),
    ("request_id too long", {"request_id": "r" * 129}, "request_id"),
    (
        "too many sources",
        {"sources": [common_pb2.Source(url=f"https://a.b/{i}") for i in range(MAX_SOURCES + 1)]},
        "sources",
    ),
    ("source without scheme", {"sources": [common_pb2.Source(url="example.org")]}, "sources[0].url"),
    ("source with file scheme", {"sources": [common_pb2.Source(url="file:///etc/passwd")]}, "sources[0].url"),
    (
        "oversized excerpt",
        {"sources": [common_pb2.Source(url="https://a.b", excerpt="x" * (MAX_CONTENT_BYTES + 1))]},
        "sources[0].excerpt",
    ),
]


@pytest.mark.parametrize(("case", "overrides", "field"), BAD_APPENDS, ids=[c[0] for c in BAD_APPENDS])
async def test_bad_append_is_invalid_argument_naming_the_field(
    stub: Stub, make_thread: Callable[[], Awaitable[str]], case: str, overrides: dict[str, object], field: str
) -> None:
    thread_id = await make_thread()
    request = finding(thread_id, **{"request_id": "r-1", **overrides})  # type: ignore[arg-type]
    error = await expect_error(stub.Append(request), grpc.StatusCode.INVALID_ARGUMENT)
    assert field in violations(error), violations(error)
    await assert_nothing_written(stub, thread_id)


async def test_every_violation_is_reported_at_once(stub: Stub, make_thread: Callable[[], Awaitable[str]]) -> None:
    thread_id = await make_thread()
    request = finding(thread_id, "", content="", kind=scratchpad_pb2.ENTRY_KIND_UNSPECIFIED)
    error = await expect_error(stub.Append(request), grpc.StatusCode.INVALID_ARGUMENT)
    assert {"request_id", "content", "kind"} <= set(violations(error))


async def test_append_to_unknown_thread_is_not_found(stub: Stub) -> None:
    error = await expect_error(stub.Append(finding("no-such-thread", "r-1")), grpc.StatusCode.NOT_FOUND)
    assert error_reason(error) == "THREAD_NOT_FOUND"
    assert "thread_id" in violations(error)


@pytest.mark.parametrize("thread_id", ["", "UPPER", "-leading-dash", "has_underscore", "a" * 64, "spa ce"])
async def test_malformed_thread_id_is_invalid_argument(stub: Stub, thread_id: str) -> None:
    calls = [
        stub.Append(finding(thread_id, "r-1")),
        stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id)),
        stub.GetThread(scratchpad_pb2.GetThreadRequest(thread_id=thread_id)),
    ]
    for call in calls:
        error = await expect_error(call, grpc.StatusCode.INVALID_ARGUMENT)
        assert "thread_id" in violations(error)
    if thread_id:
        error = await expect_error(
            stub.CreateThread(scratchpad_pb2.CreateThreadRequest(thread_id=thread_id)), grpc.StatusCode.INVALID_ARGUMENT
        )
        assert "thread_id" in violations(error)


async def test_watch_of_unknown_or_malformed_thread_fails_before_streaming(stub: Stub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in stub.Watch(scratchpad_pb2.WatchRequest(thread_id="missing-thread")):
            raise AssertionError("no entry can exist")
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in stub.Watch(scratchpad_pb2.WatchRequest(thread_id="Bad!")):
            raise AssertionError("no entry can exist")
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_read_rejects_bad_paging(stub: Stub, make_thread: Callable[[], Awaitable[str]]) -> None:
    thread_id = await make_thread()
    other = await make_thread()
    forged = [encode(f"v1:{thread_id}:{after}") for after in ["²", "9" * 30, "-1", "", "007", "1\x00", "1\n", " 1"]]
    forged += [encode(f"v1:{thread_id}\x00:1"), encode(f"v2:{thread_id}:1"), encode(f"v1:{thread_id}:1") + "="]
    forged += ["!" + encode(f"v1:{thread_id}:1")]  # characters base64 decoding would skip
    for request, field in [
        (scratchpad_pb2.ReadRequest(thread_id=thread_id, after_sequence_no=-1), "after_sequence_no"),
        (scratchpad_pb2.ReadRequest(thread_id=thread_id, page_size=-5), "page_size"),
        (scratchpad_pb2.ReadRequest(thread_id=thread_id, page_token="garbage!"), "page_token"),
        *[(scratchpad_pb2.ReadRequest(thread_id=thread_id, page_token=token), "page_token") for token in forged],
    ]:
        error = await expect_error(stub.Read(request), grpc.StatusCode.INVALID_ARGUMENT)
        assert field in violations(error)
    # A token from another thread's Read is refused, not silently applied.
    for index in range(3):
        await stub.Append(finding(other, f"r-{index}"))
    page = await stub.Read(scratchpad_pb2.ReadRequest(thread_id=other, page_size=1))
    assert page.next_page_token
    error = await expect_error(
        stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id, page_token=page.next_page_token)),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "page_token" in violations(error)


FORBIDDEN = [
    (common_pb2.ROLE_RESEARCHER, scratchpad_pb2.ENTRY_KIND_SEED),
    (common_pb2.ROLE_RESEARCHER, scratchpad_pb2.ENTRY_KIND_VERDICT),
    (common_pb2.ROLE_SUPERVISOR, scratchpad_pb2.ENTRY_KIND_ACKNOWLEDGEMENT),
    (common_pb2.ROLE_SUPERVISOR, scratchpad_pb2.ENTRY_KIND_FINDING),
    (common_pb2.ROLE_SUPERVISOR, scratchpad_pb2.ENTRY_KIND_VERDICT),
    (common_pb2.ROLE_VERIFIER, scratchpad_pb2.ENTRY_KIND_FINDING),
    (common_pb2.ROLE_VERIFIER, scratchpad_pb2.ENTRY_KIND_SEED),
    (common_pb2.ROLE_ENGINEER, scratchpad_pb2.ENTRY_KIND_FINDING),
    (common_pb2.ROLE_ENGINEER, scratchpad_pb2.ENTRY_KIND_VERDICT),
    (common_pb2.ROLE_ENGINEER, scratchpad_pb2.ENTRY_KIND_ACKNOWLEDGEMENT),
]


@pytest.mark.parametrize(("role", "kind"), FORBIDDEN)
async def test_role_that_may_not_write_a_kind_is_permission_denied(
    stub: Stub, make_thread: Callable[[], Awaitable[str]], role: int, kind: int
) -> None:
    thread_id = await make_thread()
    request = finding(thread_id, "r-1", kind=kind, author=common_pb2.Principal(principal_id="p", role=role))  # type: ignore[arg-type]
    error = await expect_error(stub.Append(request), grpc.StatusCode.PERMISSION_DENIED)
    assert error_reason(error) == "KIND_NOT_PERMITTED_FOR_ROLE"
    await assert_nothing_written(stub, thread_id)


async def test_permitted_kinds_are_written(stub: Stub, make_thread: Callable[[], Awaitable[str]]) -> None:
    thread_id = await make_thread()
    supervisor = common_pb2.Principal(principal_id="sup", role=common_pb2.ROLE_SUPERVISOR)
    verifier = common_pb2.Principal(principal_id="ver", role=common_pb2.ROLE_VERIFIER)
    engineer = common_pb2.Principal(principal_id="eng", role=common_pb2.ROLE_ENGINEER)
    allowed = [
        (supervisor, scratchpad_pb2.ENTRY_KIND_SEED),
        (RESEARCHER, scratchpad_pb2.ENTRY_KIND_FINDING),
        (RESEARCHER, scratchpad_pb2.ENTRY_KIND_MARKER),
        (verifier, scratchpad_pb2.ENTRY_KIND_VERDICT),
        (supervisor, scratchpad_pb2.ENTRY_KIND_NOTE),
        (engineer, scratchpad_pb2.ENTRY_KIND_NOTE),
        (engineer, scratchpad_pb2.ENTRY_KIND_MARKER),
    ]
    for index, (author, kind) in enumerate(allowed):
        response = await stub.Append(finding(thread_id, f"r-{index}", kind=kind, author=author))
        assert response.entry.sequence_no == index + 1
        assert response.entry.kind == kind


async def test_reused_request_id_with_different_content_is_already_exists(
    stub: Stub, make_thread: Callable[[], Awaitable[str]]
) -> None:
    thread_id = await make_thread()
    original = await stub.Append(finding(thread_id, "r-1", content="first"))
    error = await expect_error(stub.Append(finding(thread_id, "r-1", content="second")), grpc.StatusCode.ALREADY_EXISTS)
    assert error_reason(error) == "REQUEST_ID_REUSED"
    page = await stub.Read(scratchpad_pb2.ReadRequest(thread_id=thread_id))
    assert [e.content for e in page.entries] == ["first"]
    assert page.entries[0] == original.entry


async def test_creating_an_existing_thread_id_is_already_exists(stub: Stub) -> None:
    await stub.CreateThread(scratchpad_pb2.CreateThreadRequest(thread_id="taken"))
    error = await expect_error(
        stub.CreateThread(scratchpad_pb2.CreateThreadRequest(thread_id="taken")), grpc.StatusCode.ALREADY_EXISTS
    )
    assert error_reason(error) == "THREAD_EXISTS"


async def test_create_thread_is_idempotent_by_request_id(stub: Stub) -> None:
    first = await stub.CreateThread(scratchpad_pb2.CreateThreadRequest(title="t", request_id="create-1"))
    again = await stub.CreateThread(scratchpad_pb2.CreateThreadRequest(title="t", request_id="create-1"))
    assert first.thread.thread_id == again.thread.thread_id


async def test_create_thread_request_id_reused_for_another_thread_is_already_exists(stub: Stub) -> None:
    await stub.CreateThread(scratchpad_pb2.CreateThreadRequest(thread_id="a1", request_id="create-2"))
    error = await expect_error(
        stub.CreateThread(scratchpad_pb2.CreateThreadRequest(thread_id="b2", request_id="create-2")),
        grpc.StatusCode.ALREADY_EXISTS,
    )
    assert error_reason(error) == "REQUEST_ID_REUSED"
    await expect_error(stub.GetThread(scratchpad_pb2.GetThreadRequest(thread_id="b2")), grpc.StatusCode.NOT_FOUND)


async def test_create_thread_rejects_nul_in_title_and_labels(stub: Stub) -> None:
    error = await expect_error(
        stub.CreateThread(scratchpad_pb2.CreateThreadRequest(title="t\x00", labels={"k": "v\x00"})),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert {"title", "labels['k']"} <= set(violations(error))
