"""The resumable-stream helper: items in order across reconnects, none repeated or skipped, bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from quarry.streams import ResumePolicy, resumable_stream


def failure(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="test", debug_error_string="")


class FlakyLog:
    """Items 1..last; each opened stream delivers `per_connection` of them, then fails with `code`."""

    def __init__(self, last: int, per_connection: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self.last = last
        self.per_connection = per_connection
        self.code = code
        self.opened_after: list[int] = []
        self.waits = 0

    async def open_after(self, after: int) -> AsyncIterator[int]:
        self.opened_after.append(after)
        return self._items(after)

    async def _items(self, after: int) -> AsyncIterator[int]:
        for item in range(after + 1, min(after + self.per_connection, self.last) + 1):
            yield item
        if after + self.per_connection < self.last:
            raise failure(self.code)

    async def wait_until_back(self) -> None:
        self.waits += 1


async def collect(log: FlakyLog, *, after: int = 0, policy: ResumePolicy | None = None, done_at: int = 0) -> list[int]:
    items = resumable_stream(
        log.open_after,
        lambda item: item,
        after=after,
        wait_until_back=log.wait_until_back,
        policy=policy or ResumePolicy(),
        done=lambda item: item == done_at,
    )
    return [item async for item in items]


async def test_items_come_in_order_across_reconnects_from_the_last_one_received() -> None:
    log = FlakyLog(last=7, per_connection=3)
    assert await collect(log, after=1) == [2, 3, 4, 5, 6, 7]
    assert log.opened_after == [1, 4] and log.waits == 1


async def test_the_stream_ends_after_a_done_item() -> None:
    log = FlakyLog(last=10, per_connection=2)
    assert await collect(log, done_at=3) == [1, 2, 3]
    assert log.opened_after == [0, 2]


async def test_a_status_that_does_not_resume_is_raised() -> None:
    log = FlakyLog(last=5, per_connection=2, code=grpc.StatusCode.PERMISSION_DENIED)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await collect(log)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED and log.waits == 0


async def test_reconnects_without_progress_are_bounded() -> None:
    log = FlakyLog(last=5, per_connection=0)
    with pytest.raises(grpc.aio.AioRpcError):
        await collect(log, policy=ResumePolicy(max_reconnects=3))
    assert log.opened_after == [0, 0, 0, 0] and log.waits == 3


async def test_an_item_received_resets_the_reconnect_count() -> None:
    log = FlakyLog(last=6, per_connection=1)
    assert await collect(log, policy=ResumePolicy(max_reconnects=1)) == [1, 2, 3, 4, 5, 6]
