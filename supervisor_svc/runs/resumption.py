"""What a run had done before this process took it up: read back from what it recorded, never re-asked.

A run whose supervisor stopped (a crash, a restart, another replica's lease sweep) is continued, not
failed. Its conversation is in the conversation store (quarry.agent.loop goes on from it), and its
delegations are on its ledger: each Assignment names the delegation id and the key it was ordered
under, each UsageObserved what it cost. With the ids known, a delegation ordered again under the same
key reaches the worker as the same delegation, which replays its recorded result or goes on with its
recorded conversation; with the usage known, the run's account and token budget stay whole.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from quarry.agent.usage import Usage
from quarry.identity import Role
from quarry.records.base import RecordError
from quarry.records.research import Assignment, UsageObserved, parse_record
from quarry.v1 import supervisor_pb2
from quarry.vocabulary import Entry, EntryKind
from supervisor_svc.hosting.store import StoredEvent


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
        """The delegation id to order each key under again: the latest one ordered under it. A researcher's
        key is a model's tool call id, which a model may reuse from turn to turn: only those of the calls the
        stopped turn left unanswered are taken. The run's own keys (verify-12, audit-3-r0) are unique."""
        reuse: dict[str, str] = {}
        for delegation_id, ordered in self.ordered.items():
            if ordered.role is not Role.RESEARCHER or ordered.key in unanswered:
                reuse[ordered.key] = delegation_id
        return reuse

    def usage(self) -> tuple[Usage, Usage]:
        """What the recorded delegations cost: all of them, and the part the evidence roles spent."""
        workers, verification = Usage(), Usage()
        for delegation_id, usage in self.used.items():
            workers += usage
            ordered = self.ordered.get(delegation_id)
            if ordered is not None and ordered.role is not Role.RESEARCHER:
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
