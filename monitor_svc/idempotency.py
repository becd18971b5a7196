"""Changes made once per request_id, for jobs and workspaces alike: a retry gets the first call's answer.

Each change runs as a task of its own, so a caller that goes away (a deadline) does not stop it
half done; a retry while it runs waits for the same task. A request_id used for a different
request is refused. A change that failed is forgotten, so a retry may try again, unless the
change itself remembered an answer before it failed (a job that may have started is never
started twice). The length limit is the mesh's own (quarry/ids.py).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from monitor_svc.validation import refuse_nul
from quarry.errors import AlreadyExists, ErrorReason, FieldViolation, InvalidArgument
from quarry.ids import MAX_REQUEST_ID_CHARS

_T = TypeVar("_T")


def check_request_id(request_id: str, *, when_missing: str | None = None) -> None:
    """No NUL, at most MAX_REQUEST_ID_CHARS; an empty one is refused with `when_missing` when given."""
    refuse_nul({"request_id": request_id})
    if not request_id and when_missing is not None:
        raise InvalidArgument([FieldViolation("request_id", when_missing)])
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument([FieldViolation("request_id", f"at most {MAX_REQUEST_ID_CHARS} characters")])


class Once:
    """Answers by request_id. `key` tells one request from another under the same id (a digest, a tuple);
    each change has its own type of answer."""

    def __init__(self, *, remembered: int | None = None, conflict: str = "was used for a different request") -> None:
        self._remembered = remembered  # how many answers are kept (None: all, e.g. jobs, which have records)
        self._conflict = conflict
        self._running: dict[str, tuple[object, asyncio.Future[Any]]] = {}
        self._answers: OrderedDict[str, tuple[object, Any]] = OrderedDict()

    def remember(self, request_id: str, key: object, answer: object) -> None:
        """An answer known without running the change again: reloaded after a restart, or recorded midway."""
        self._answers[request_id] = (key, answer)
        self._answers.move_to_end(request_id)
        while self._remembered is not None and len(self._answers) > self._remembered:
            self._answers.popitem(last=False)

    def forget(self, request_id: str) -> None:
        self._answers.pop(request_id, None)

    async def once(self, request_id: str, key: object, act: Callable[[], Awaitable[_T]]) -> _T:
        if not request_id:
            return await asyncio.shield(asyncio.ensure_future(act()))
        if request_id not in self._running and request_id not in self._answers:
            self._running[request_id] = (key, asyncio.ensure_future(act()))
        running = self._running.get(request_id)
        if running is None:  # done before: its answer
            known, answer = self._answers[request_id]
            self._check(request_id, known, key)
            remembered: _T = answer
            return remembered
        self._check(request_id, running[0], key)
        future = running[1]  # still running: its answer once it has one
        try:
            result: _T = await asyncio.shield(future)
            return result
        finally:
            if future.done() and self._running.get(request_id) is running:
                del self._running[request_id]
                if not future.cancelled() and future.exception() is None:
                    self.remember(request_id, key, future.result())

    def _check(self, request_id: str, known: object, key: object) -> None:
        if known != key:
            raise AlreadyExists(f"request_id {request_id!r} {self._conflict}", reason=ErrorReason.REQUEST_ID_REUSED)
