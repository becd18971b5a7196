"""The retry rules the services expect, shared by every client.

Mutations carry a request_id, so a client can retry them after UNAVAILABLE or a deadline without risking a
duplicate: the service answers a repeat with the original result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

__all__ = ["RetryPolicy", "is_retryable"]

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def is_retryable(error: BaseException) -> bool:
    return isinstance(error, grpc.aio.AioRpcError) and error.code() in RETRYABLE


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying a safe-to-repeat call, and how each attempt is bounded."""

    total_seconds: float = 30.0
    attempt_timeout: float = 10.0
    initial_backoff: float = 0.05
    max_backoff: float = 2.0

    def retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception(is_retryable),
            stop=stop_after_delay(self.total_seconds),
            wait=wait_exponential_jitter(multiplier=self.initial_backoff, max=self.max_backoff),
            reraise=True,
        )

    async def call(self, method: Callable[..., Any], request: Message, *, extra_timeout: float = 0.0) -> Any:
        """One unary call, retried under this policy; each attempt bounded by attempt_timeout."""
        async for attempt in self.retrying():
            with attempt:
                return await method(request, timeout=self.attempt_timeout + extra_timeout)
        raise AssertionError("unreachable: the last failure is re-raised")
