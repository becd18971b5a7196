"""Public run events: how they are built, numbered and stored, and how waiting streams learn of them.

Internal traffic has no way in: the builders here take phases, entries and
text, never tool calls, so no delegation, scratchpad or web tool request can
reach a client as something to execute. Streams are woken through a
quarry.notify.CommitSignal keyed by run id (and, on PostgreSQL, by NOTIFYs
from other replicas).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from quarry.notify import CommitSignal
from quarry.v1 import common_pb2, scratchpad_pb2, supervisor_pb2, worker_pb2
from supervisor_svc.model import Report, RunErrorCode, RunUsage, TierUsage
from supervisor_svc.store import RunStore

_PREVIEW_CHARS = 500
_ERROR_CODES = {
    RunErrorCode.PROVIDER_ERROR: supervisor_pb2.RUN_ERROR_CODE_PROVIDER_ERROR,
    RunErrorCode.DEADLINE_EXCEEDED: supervisor_pb2.RUN_ERROR_CODE_DEADLINE_EXCEEDED,
    RunErrorCode.INTERNAL: supervisor_pb2.RUN_ERROR_CODE_INTERNAL,
}


def tier_usage_to_proto(usage: TierUsage) -> common_pb2.Usage:
    return common_pb2.Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        model_calls=usage.model_calls,
        tool_calls=usage.tool_calls,
    )


def usage_to_proto(usage: RunUsage) -> supervisor_pb2.RunUsage:
    return supervisor_pb2.RunUsage(
        supervisor=tier_usage_to_proto(usage.supervisor),
        workers=tier_usage_to_proto(usage.workers),
        total=tier_usage_to_proto(usage.total),
    )


def report_to_proto(report: Report) -> supervisor_pb2.Report:
    return supervisor_pb2.Report(
        markdown=report.markdown,
        citations=[
            supervisor_pb2.Citation(
                number=c.number, url=c.url, title=c.title, excerpt=c.excerpt, scratchpad_sequence_no=c.sequence_no
            )
            for c in report.citations
        ],
    )


def error_to_proto(code: RunErrorCode, message: str) -> supervisor_pb2.RunError:
    return supervisor_pb2.RunError(code=_ERROR_CODES[code], message=message)


def status(
    phase: supervisor_pb2.ResearchPhase.ValueType,
    message: str,
    *,
    delegation_id: str = "",
    result: worker_pb2.DelegationResult | None = None,
) -> supervisor_pb2.RunEvent:
    event = supervisor_pb2.ResearchStatusEvent(phase=phase, message=message, delegation_id=delegation_id)
    if result is not None:
        event.delegation_outcome = result.outcome
        if result.HasField("error"):
            event.delegation_error.CopyFrom(result.error)
    return supervisor_pb2.RunEvent(status=event)


def scratchpad_entry(entry: scratchpad_pb2.Entry) -> supervisor_pb2.RunEvent:
    preview = entry.content if len(entry.content) <= _PREVIEW_CHARS else entry.content[:_PREVIEW_CHARS] + "…"
    return supervisor_pb2.RunEvent(
        scratchpad=supervisor_pb2.ScratchpadEvent(
            scratchpad_sequence_no=entry.sequence_no, kind=entry.kind, author=entry.author, preview=preview
        )
    )


def completed(report: Report, usage: RunUsage) -> supervisor_pb2.RunEvent:
    return supervisor_pb2.RunEvent(
        completed=supervisor_pb2.RunCompletedEvent(
            report=report_to_proto(report),
            usage=usage_to_proto(usage),
            removed_citations=report.removed_citations,
            token_budget_exhausted=report.token_budget_exhausted,
            turn_budget_exhausted=report.turn_budget_exhausted,
        )
    )


def failed(code: RunErrorCode, message: str, usage: RunUsage) -> supervisor_pb2.RunEvent:
    return supervisor_pb2.RunEvent(
        failed=supervisor_pb2.RunFailedEvent(error=error_to_proto(code, message), usage=usage_to_proto(usage))
    )


def cancelled(reason: str, usage: RunUsage) -> supervisor_pb2.RunEvent:
    return supervisor_pb2.RunEvent(
        cancelled=supervisor_pb2.RunCancelledEvent(reason=reason, usage=usage_to_proto(usage))
    )


class RunEventLog:
    """One run's writer: numbers and stores its events in call order, then wakes the run's streams."""

    def __init__(self, store: RunStore, bus: CommitSignal, run_id: str) -> None:
        self._store = store
        self._bus = bus
        self._run_id = run_id
        self._lock = asyncio.Lock()

    async def emit(
        self, *events: supervisor_pb2.RunEvent, terminal: bool = False, values: dict[str, Any] | None = None
    ) -> None:
        async with self._lock:
            await self._store.append(self._run_id, events, terminal=terminal, values=values)
        self._bus.publish(self._run_id)


class TextStream:
    """Coalesces streamed text into events of a useful size: one per ~200 characters or 100 ms."""

    def __init__(
        self,
        make: Callable[[str], supervisor_pb2.RunEvent],
        emit: Callable[[supervisor_pb2.RunEvent], Awaitable[None]],
        *,
        max_chars: int = 200,
        max_delay: float = 0.1,
    ) -> None:
        self._make = make
        self._emit = emit
        self._max_chars = max_chars
        self._max_delay = max_delay
        self._buffer: list[str] = []
        self._size = 0
        self._since = 0.0

    async def add(self, text: str) -> None:
        if not text:
            return
        if not self._buffer:
            self._since = time.monotonic()
        self._buffer.append(text)
        self._size += len(text)
        if self._size >= self._max_chars or time.monotonic() - self._since >= self._max_delay:
            await self.flush()

    async def flush(self) -> None:
        if self._buffer:
            text = "".join(self._buffer)
            self._buffer.clear()
            self._size = 0
            await self._emit(self._make(text))


def reasoning(delta: str) -> supervisor_pb2.RunEvent:
    return supervisor_pb2.RunEvent(reasoning=supervisor_pb2.ReasoningEvent(delta=delta))


def content(delta: str) -> supervisor_pb2.RunEvent:
    return supervisor_pb2.RunEvent(content=supervisor_pb2.ContentEvent(delta=delta))
