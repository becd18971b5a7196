"""Changes made once per request_id (monitor_svc/idempotency.py), for jobs and workspaces alike."""

from __future__ import annotations

import asyncio

import pytest

from monitor_svc.idempotency import Once, check_request_id
from quarry.errors import AlreadyExists, ErrorReason, InvalidArgument
from quarry.ids import MAX_REQUEST_ID_CHARS


async def test_a_retry_while_the_change_runs_gets_its_answer_and_the_change_runs_once() -> None:
    once, runs, go = Once(), [], asyncio.Event()

    async def act() -> str:
        runs.append(1)
        await go.wait()
        return "done"

    first = asyncio.ensure_future(once.once("r1", "key", act))
    second = asyncio.ensure_future(once.once("r1", "key", act))
    await asyncio.sleep(0)
    go.set()
    assert await asyncio.gather(first, second) == ["done", "done"]
    assert await once.once("r1", "key", act) == "done" and runs == [1]


async def test_a_request_id_used_for_another_request_is_refused() -> None:
    once = Once(conflict="already started a different job")

    async def act() -> int:
        return 1

    await once.once("r1", "key", act)
    with pytest.raises(AlreadyExists, match="already started a different job") as raised:
        await once.once("r1", "another key", act)
    assert raised.value.reason == ErrorReason.REQUEST_ID_REUSED


async def test_a_failed_change_is_tried_again_unless_it_remembered_an_answer() -> None:
    once, runs = Once(), []

    async def fails() -> str:
        runs.append(1)
        raise RuntimeError("no")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            await once.once("r1", "key", fails)
    assert runs == [1, 1], "forgotten: a retry tries again"

    async def may_have_started() -> str:
        once.remember("r2", "key", "given up")  # as a job recorded before its start failed midway
        raise RuntimeError("midway")

    with pytest.raises(RuntimeError):
        await once.once("r2", "key", may_have_started)
    assert await once.once("r2", "key", may_have_started) == "given up"


async def test_only_the_latest_answers_are_remembered_and_none_without_a_request_id() -> None:
    once, runs = Once(remembered=2), []

    async def act() -> int:
        runs.append(1)
        return len(runs)

    for request_id in ("a", "b", "c"):
        await once.once(request_id, "key", act)
    assert await once.once("a", "key", act) == 4, "the oldest answer was dropped"
    assert await once.once("c", "key", act) == 3
    assert [await once.once("", "key", act) for _ in range(2)] == [5, 6]


def test_request_ids_within_the_mesh_limit() -> None:
    check_request_id("x" * MAX_REQUEST_ID_CHARS)
    check_request_id("")  # optional, unless the caller says what it is for
    for request_id, when_missing in (("x" * (MAX_REQUEST_ID_CHARS + 1), None), ("", "required"), ("a\x00", None)):
        with pytest.raises(InvalidArgument) as raised:
            check_request_id(request_id, when_missing=when_missing)
        assert raised.value.violations[0].field == "request_id"
