"""The research ledger's integrity, checked before an entry is accepted: a record's references name entries
that exist and are of the kind it says, an objection is settled once, and a delegation's route and usage
follow its assignment. A thread that passes these checks folds to one Verification, the one the run serves.

Checked against what the thread holds when the append arrives (ScratchpadStore.ledger_view), not inside the
commit: two different appends for one objection racing each other could both pass. A run's supervisor writes
each objection's resolution once, under one request id, so its retries are answered from the store instead.
"""

from __future__ import annotations

import json

from quarry.errors import FailedPrecondition, FieldViolation, InvalidArgument
from quarry.records.base import RecordError
from quarry.records.research import ObjectionResolution, ResearchRecord, RouteDecision, UsageObserved, parse_record
from quarry.vocabulary import EntryKind
from scratchpad_svc.store import ScratchpadStore
from scratchpad_svc.threads import AppendCommand


async def check_ledger_record(store: ScratchpadStore, command: AppendCommand, record: ResearchRecord) -> None:
    """Refuse `record` (the research record `command` appends) when the thread says it cannot be so:
    INVALID_ARGUMENT for a reference to nothing or to an entry of another kind, FAILED_PRECONDITION for a second
    resolution of an objection and for a route or usage of a delegation the thread never assigned."""
    wanted = record.referenced_kinds()
    related_kind, containing = _related(record)
    if not wanted and related_kind is None:
        return
    view = await store.ledger_view(command.thread_id, command.request_id, wanted, related_kind, containing)
    if view.retry:
        return  # the first append with this request id was checked; the store answers the retry
    problems = []
    for number, kind in sorted(wanted.items()):
        found = view.kinds.get(number)
        if found is None:
            problems.append(f"entry {number} does not exist in thread {command.thread_id}")
        elif found is not kind:
            problems.append(f"entry {number} is ENTRY_KIND_{found.name}, not ENTRY_KIND_{kind.name}")
    if problems:
        raise InvalidArgument([FieldViolation("content", f"refers to {problem}") for problem in problems])
    matching = [number for number, content in view.related if _matches(record, related_kind, content)]
    if isinstance(record, ObjectionResolution) and matching:
        raise FailedPrecondition(
            f"objection {record.objection_ref} is already settled, by entry {matching[0]}: an objection is "
            "resolved once"
        )
    if isinstance(record, (RouteDecision, UsageObserved)) and not matching:
        raise FailedPrecondition(
            f"delegation {record.delegation_id} has no assignment in thread {command.thread_id}: a delegation's "
            "route and usage follow its assignment"
        )


def _related(record: ResearchRecord) -> tuple[EntryKind | None, str]:
    """The kind of earlier entry the record is checked against, and a piece of text such an entry's content holds
    as the supervisor writes it (compact JSON): a prefilter, each candidate is parsed and compared."""
    if isinstance(record, ObjectionResolution):
        return EntryKind.RESOLUTION, f'"objection_ref":{record.objection_ref}'
    if isinstance(record, (RouteDecision, UsageObserved)):
        return EntryKind.ASSIGNMENT, json.dumps(record.delegation_id, ensure_ascii=False)
    return None, ""


def _matches(record: ResearchRecord, kind: EntryKind | None, content: str) -> bool:
    if kind is None:
        return False
    try:
        earlier = parse_record(kind, content)
    except RecordError:
        return False
    if isinstance(record, ObjectionResolution):
        return isinstance(earlier, ObjectionResolution) and earlier.objection_ref == record.objection_ref
    delegation = getattr(record, "delegation_id", None)
    return getattr(earlier, "delegation_id", None) == delegation
