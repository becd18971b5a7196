"""What a run had done before this process took it up: read back from what it recorded, never re-asked;
and the wait for a database that went away, after which a run is taken up the same way.

A run whose supervisor stopped (a crash, a restart, another replica's lease sweep) is continued, not
failed. Its conversation is in the conversation store (quarry.agent.loop goes on from it), and its
delegations are on its ledger: each Assignment names the delegation id and the key it was ordered
under, each UsageObserved what it cost. With the ids known, a delegation ordered again under the same
key reaches the worker as the same delegation, which replays its recorded result or goes on with its
recorded conversation; with the usage known, the run's account and token budget stay whole.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from quarry.agent.conversation import ConversationStore
from quarry.agent.loop import unanswered_calls
from quarry.agent.messages import Message
from quarry.agent.usage import Usage
from quarry.errors import Unavailable
from quarry.identity import Role
from quarry.records.base import RecordError
from quarry.records.research import Assignment, UsageObserved, parse_record
from quarry.records.verification import Verification
from quarry.research_plane import ResearchPlane
from quarry.v1 import supervisor_pb2
from quarry.vocabulary import Entry, EntryKind
from supervisor_svc.hosting.store import StoredEvent
from supervisor_svc.runs.delegating import EarlierOrders
from supervisor_svc.runs.domain import REVIEW_ROLES, Report, RunRecord, RunState
from supervisor_svc.runs.store import RunStore
from supervisor_svc.verification.report import without_verification

log = logging.getLogger(__name__)

# How often a run is taken up (after its supervisor stopped) before it is failed instead.
MAX_TAKEOVERS = 5


@dataclass(frozen=True)
class _Ordered:
    number: int  # the order of the delegation within the run
    key: str  # the tool call id or the task name it was ordered under
    role: Role


@dataclass(frozen=True)
class PriorDelegations:
    """The delegations a run ordered before this process took it up, from its ledger."""

    run_id: str
    ordered: dict[str, _Ordered] = field(default_factory=dict)  # by delegation id, in ledger order
    used: dict[str, Usage] = field(default_factory=dict)  # the delegations whose usage is on the ledger

    @classmethod
    def from_ledger(cls, run_id: str, entries: Iterable[Entry]) -> PriorDelegations:
        prior = cls(run_id)
        prefix = f"{run_id}."
        for entry in entries:
            if entry.author.principal_id != run_id or entry.kind not in (EntryKind.ASSIGNMENT, EntryKind.USAGE):
                continue
            try:
                record = parse_record(entry.kind, entry.content)
            except RecordError:
                continue
            if isinstance(record, Assignment) and record.delegation_id.startswith(prefix):
                number, _, key = record.delegation_id[len(prefix) :].partition(".")
                if number.isdigit():
                    prior.ordered[record.delegation_id] = _Ordered(int(number), key, record.role)
            elif isinstance(record, UsageObserved):
                prior.used[record.delegation_id] = Usage(
                    input_tokens=record.input_tokens,
                    output_tokens=record.output_tokens,
                    model_calls=record.model_calls,
                )
        return prior

    @property
    def last_number(self) -> int:
        return max((ordered.number for ordered in self.ordered.values()), default=0)

    def ids_to_reuse(self, unanswered: Collection[str]) -> dict[str, str]:
        """The delegation id to order each key under again: the latest one ordered under it. A delegation the
        model asked for (a researcher's, a scout's, an extractor's) is keyed by its tool call id, which a model
        may reuse from turn to turn: only those of the calls the stopped turn left unanswered are taken. The
        run's own keys (verify-12, audit-3-r0) are unique."""
        reuse: dict[str, str] = {}
        for delegation_id, ordered in self.ordered.items():
            if ordered.role in REVIEW_ROLES or ordered.key in unanswered:
                reuse[ordered.key] = delegation_id
        return reuse

    def usage(self) -> tuple[Usage, Usage]:
        """What the recorded delegations cost: all of them, and the part the evidence roles spent."""
        workers, verification = Usage(), Usage()
        for delegation_id, usage in self.used.items():
            workers += usage
            ordered = self.ordered.get(delegation_id)
            if ordered is not None and ordered.role in REVIEW_ROLES:
                verification += usage
        return workers, verification


# How a run's events say that another process took it up (a STARTED status beginning so).
TAKEN_UP_NOTE = "taken up again by this supervisor after the one running it stopped"


@dataclass(frozen=True)
class PublishedSoFar:
    """What the run's stored events already told its clients."""

    last_entry: int  # the newest scratchpad entry reported (each is reported once)
    report_streamed: bool  # some of the report's text went out: writing it again sends it anew
    # How often a process took the run up before (each said so: TAKEN_UP_NOTE).
    takeovers: int = 0

    @classmethod
    def read(cls, events: Iterable[StoredEvent]) -> PublishedSoFar:
        newest, streamed, taken_up = 0, False, 0
        for event in events:
            decoded = supervisor_pb2.RunEvent.FromString(event.payload)
            kind = decoded.WhichOneof("payload")
            if kind == "scratchpad":
                newest = max(newest, decoded.scratchpad.scratchpad_sequence_no)
            streamed = streamed or kind == "content"
            if kind == "status" and decoded.status.phase == supervisor_pb2.RESEARCH_PHASE_STARTED:
                taken_up += decoded.status.message.startswith(TAKEN_UP_NOTE)
        return cls(newest, streamed, taken_up)


class TakenUpTooOften(Exception):
    """Every process that took the run up stopped before it ended: it is failed rather than taken up forever."""


@dataclass(frozen=True)
class TakenUp:
    """A run as the process that takes it up finds it: its delegations, its events, its conversation."""

    prior: PriorDelegations
    published: PublishedSoFar
    history: list[Message]  # the supervisor's conversation as recorded

    def earlier_orders(self) -> EarlierOrders:
        """What the run's Delegator goes on from."""
        unanswered = {call.id[:40] for call in unanswered_calls(self.history)}
        return EarlierOrders(self.prior.ids_to_reuse(unanswered), self.prior.used.keys(), self.prior.last_number)


async def read_back(
    record: RunRecord,
    store: RunStore,
    scratchpad: ResearchPlane,
    conversations: ConversationStore,
    conversation_id: str,
) -> TakenUp:
    """Everything a run recorded that the process taking it up needs (its thread must exist: seed it first);
    TakenUpTooOften when it was taken up MAX_TAKEOVERS times already."""
    published = PublishedSoFar.read(await store.all_events(record.run_id))
    if published.takeovers >= MAX_TAKEOVERS:
        raise TakenUpTooOften(
            f"the run was taken up {published.takeovers} times and each supervisor running it stopped before "
            "it ended (a run that brings its supervisor down?); it is not taken up again"
        )
    entries = await scratchpad.read_all(record.scratchpad_thread_id)
    history = await conversations.history(conversation_id)
    return TakenUp(PriorDelegations.from_ledger(record.run_id, entries), published, history)


def time_left(record: RunRecord, timeout: float) -> float:
    """What is left of a run's time limit, counted from its start (as another process recorded it)."""
    started = record.start_time or record.create_time
    return max(timeout - (datetime.now(UTC) - started).total_seconds(), 0.001)


def awaited_approval(record: RunRecord) -> tuple[Report, Verification | None] | None:
    """The report and verification a run taken up in AWAITING_APPROVAL waits with, as they were before the
    verification sections were added; None when it was not waiting."""
    if record.state is not RunState.AWAITING_APPROVAL or record.report is None:
        return None
    verification = record.verification
    report = record.report if verification is None else without_verification(record.report, verification)
    return report, verification


class DatabaseStayedAway(Exception):
    """The database did not answer within the wait; the message says since when."""


async def wait_for_database(
    store: RunStore, run_id: str, bound: float, reclaim: Callable[[str], Awaitable[bool]] | None
) -> tuple[RunRecord | None, str]:
    """Wait (`bound` seconds at most) until the run's database answers; then the run's record, or None when
    it ended or another process holds it now, and a note for its events. DatabaseStayedAway past `bound`."""
    since = datetime.now(UTC)
    log.warning("run %s: its database is unreachable; waiting up to %g s for it", run_id, bound)
    loop = asyncio.get_running_loop()
    until = loop.time() + bound
    delay = 0.5
    while True:
        try:
            # A write, so that a full disk is waited out as well as an unreachable server.
            held = await reclaim(run_id) if reclaim is not None else True
            record = await store.get(run_id)
            break
        except Unavailable as error:
            if loop.time() + delay > until:
                message = f"the database was unreachable from {since:%H:%M:%S} UTC for longer than {bound:g} s"
                raise DatabaseStayedAway(message) from error
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
    waited = (datetime.now(UTC) - since).total_seconds()
    if record is None or record.state.ended or not held:
        log.warning("run %s: after the outage another process holds it; leaving it to that one", run_id)
        return None, ""
    log.warning("run %s: its database answers again after %.1f s; going on", run_id, waited)
    return record, f"the database was unreachable from {since:%H:%M:%S} UTC for {waited:.0f} s; going on from there"
