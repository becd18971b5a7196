"""Following a server stream across reconnects, resuming after the last item received.

A Quarry stream (a scratchpad Watch, a run's StreamRun) is opened "after" a
sequence number, so a client that lost its connection can open it again after
the last item it got: nothing is repeated and nothing is skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

__all__ = ["ResumePolicy", "resumable_stream"]

_Item = TypeVar("_Item")


@dataclass(frozen=True)
class ResumePolicy:
    """Which failures re-open a stream, and how often in a row (an item received resets the count)."""

    codes: frozenset[grpc.StatusCode] = field(default_factory=lambda: frozenset({grpc.StatusCode.UNAVAILABLE}))
    max_reconnects: int = 100

    def resumes(self, error: grpc.aio.AioRpcError, reconnects: int) -> bool:
        return error.code() in self.codes and reconnects < self.max_reconnects


def _never(_: object) -> bool:
    return False


async def resumable_stream(
    open_after: Callable[[int], Awaitable[AsyncIterator[_Item]]],
    position_of: Callable[[_Item], int],
    *,
    after: int,
    wait_until_back: Callable[[], Awaitable[object]],
    policy: ResumePolicy,
    done: Callable[[_Item], bool] = _never,
) -> AsyncIterator[_Item]:
    """The items of `open_after(position)`, in order, re-opened after the last one received whenever it
    fails with a resumable status; ends when the server ends the stream or after an item that is `done`.

    `wait_until_back` is the backoff before each reconnect: it returns once the service answers again.
    """
    reconnects = 0
    while True:
        try:
            async for item in await open_after(after):
                reconnects = 0
                after = position_of(item)
                yield item
                if done(item):
                    return
            return
        except grpc.aio.AioRpcError as error:
            if not policy.resumes(error, reconnects):
                raise
            reconnects += 1
            await wait_until_back()
