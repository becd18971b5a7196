"""The campaign's records on its scratchpad thread: read once per cycle, each write added to what was read.

Every record (trials, dead ends, insights, directives, decisions, violations) is a typed entry keyed by
a request_id derived from the campaign and the cycle, so a redone step writes nothing twice. What a
cycle writes is added to the records it read at its start (unless the thread already held it), so the
cycle sees the thread as it is without reading it again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import grpc

from quarry.errors import ServiceError
from quarry.identity import Principal, Role
from quarry.records.campaign import (
    CampaignRecord,
    CampaignReport,
    DeadEnd,
    Decision,
    Directive,
    DirectiveConsumed,
    Insight,
    TrialRecord,
    Violation,
    record_from_json,
)
from quarry.research_plane import ResearchPlane
from quarry.vocabulary import EntryKind

_KINDS: dict[type[Any], EntryKind] = {
    TrialRecord: EntryKind.CAMPAIGN_LEDGER,
    DeadEnd: EntryKind.CAMPAIGN_DEAD_END,
    Insight: EntryKind.CAMPAIGN_INSIGHT,
    Directive: EntryKind.CAMPAIGN_DIRECTIVE,
    DirectiveConsumed: EntryKind.CAMPAIGN_DIRECTIVE,
    Decision: EntryKind.CAMPAIGN_DECISION,
    Violation: EntryKind.CAMPAIGN_DECISION,
    CampaignReport: EntryKind.CAMPAIGN_DECISION,
}
_RECORD_KINDS = frozenset(_KINDS.values())

_T = TypeVar("_T")


class CampaignThread:
    def __init__(self, scratchpad: ResearchPlane, campaign_id: str, thread_id: str) -> None:
        self._scratchpad = scratchpad
        self._campaign_id = campaign_id
        self.thread_id = thread_id
        self._author = Principal(principal_id=f"campaign-{campaign_id}", role=Role.SUPERVISOR)
        self._records: list[CampaignRecord] = []

    @property
    def records(self) -> Sequence[CampaignRecord]:
        """The records as of the last read, with those written since."""
        return self._records

    async def create(self, title: str) -> None:
        """Open the thread (a repeat, after a restart, answers the first result)."""
        await _ask(
            self._scratchpad.create_thread(self.thread_id, title=title, request_id=f"{self._campaign_id}/thread")
        )

    async def read(self) -> Sequence[CampaignRecord]:
        entries = await self._scratchpad.read_all(self.thread_id)
        self._records = [record_from_json(entry.content) for entry in entries if entry.kind in _RECORD_KINDS]
        return self._records

    async def write(self, record: CampaignRecord, key: str) -> None:
        """Append a record to the thread once per key."""
        appended = await _ask(
            self._scratchpad.append(
                self.thread_id,
                kind=_KINDS[type(record)],
                author=self._author,
                content=record.to_json(),
                request_id=f"{self._campaign_id}/{key}",
            )
        )
        if not appended.replayed:  # a replayed one was read with the rest
            self._records.append(record)


async def _ask(call: Awaitable[_T]) -> _T:
    """The scratchpad's answer; its failure as a ServiceError, in the QuarryError tree the loop handles."""
    try:
        return await call
    except grpc.aio.AioRpcError as error:
        raise ServiceError.of(error) from error
