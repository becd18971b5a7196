"""Which roles may write which entry kinds: enforced here, in code, never by prompt."""

from __future__ import annotations

from types import MappingProxyType

from quarry.errors import ErrorReason, PermissionDenied
from quarry.identity import MeshRole, Role
from quarry.records.research import Objection, ResearchRecord
from quarry.vocabulary import EntryKind

WRITABLE_KINDS: MappingProxyType[Role, frozenset[EntryKind]] = MappingProxyType(
    {
        # The supervisor seeds the thread, coordinates and keeps the research ledger (assignments, routes,
        # observed usage, how each objection was settled) and a campaign's records; its report is the
        # run's, not an entry, and it never records findings or judgements.
        Role.SUPERVISOR: frozenset(
            {
                EntryKind.SEED,
                EntryKind.MARKER,
                EntryKind.NOTE,
                EntryKind.ASSIGNMENT,
                EntryKind.ROUTE,
                EntryKind.USAGE,
                EntryKind.RESOLUTION,
                EntryKind.OBJECTION,  # only those its citation checks raise (check_record_author)
                EntryKind.REFUSAL,
                EntryKind.SENTENCE,
                EntryKind.CAMPAIGN_LEDGER,
                EntryKind.CAMPAIGN_DEAD_END,
                EntryKind.CAMPAIGN_INSIGHT,
                EntryKind.CAMPAIGN_DIRECTIVE,
                EntryKind.CAMPAIGN_DECISION,
            }
        ),
        # Researchers promote verified findings and coordinate with each other.
        Role.RESEARCHER: frozenset({EntryKind.FINDING, EntryKind.MARKER, EntryKind.ACKNOWLEDGEMENT, EntryKind.NOTE}),
        # Claim-verifiers judge findings; they do not add findings of their own.
        Role.VERIFIER: frozenset({EntryKind.VERDICT, EntryKind.ACKNOWLEDGEMENT, EntryKind.NOTE}),
        # Engineers report what they built and ran; findings and verdicts are the researchers' and verifiers'.
        Role.ENGINEER: frozenset({EntryKind.NOTE, EntryKind.MARKER}),
        # Citation auditors judge report sentences, and object to the unsound ones; nothing else.
        Role.CITATION_AUDITOR: frozenset({EntryKind.AUDIT, EntryKind.OBJECTION}),
        # Adjudicators decide objections; nothing else.
        Role.ADJUDICATOR: frozenset({EntryKind.ADJUDICATION}),
        # Bibliographic verifiers judge the papers findings cite; nothing else.
        Role.BIBLIOGRAPHIC_VERIFIER: frozenset({EntryKind.BIBLIOGRAPHIC_VERDICT}),
        # Scouts record candidate sources, extractors the records they take out of one source; nothing else.
        Role.SCOUT: frozenset({EntryKind.CANDIDATES}),
        Role.EXTRACTOR: frozenset({EntryKind.EVIDENCE}),
        # Writers answer with their report: they write no entry.
        Role.WRITER: frozenset(),
    }
)


# The roles an authenticated caller may write as: a request's author role is a claim checked against this.
ROLES_OF_CALLER: MappingProxyType[MeshRole, frozenset[Role]] = MappingProxyType(
    {
        MeshRole.SUPERVISOR: frozenset({Role.SUPERVISOR}),
        # A worker runs every delegated role.
        MeshRole.WORKER: frozenset(
            {
                Role.RESEARCHER,
                Role.VERIFIER,
                Role.ENGINEER,
                Role.CITATION_AUDITOR,
                Role.ADJUDICATOR,
                Role.BIBLIOGRAPHIC_VERIFIER,
                Role.SCOUT,
                Role.EXTRACTOR,
                Role.WRITER,
            }
        ),
    }
)


def check_may_act_as(caller: MeshRole | None, role: Role) -> None:
    """Refuse an author role the authenticated caller does not hold (None: the service runs unauthenticated)."""
    if caller is not None and role not in ROLES_OF_CALLER[caller]:
        allowed = ", ".join(sorted(f"ROLE_{r.name}" for r in ROLES_OF_CALLER[caller]))
        raise PermissionDenied(
            f"the {caller.value} may not write as ROLE_{role.name}; it writes as {allowed}",
            reason=ErrorReason.CALLER_NOT_PERMITTED,
            metadata={"caller": caller.value, "role": role.value},
        )


def may_write(role: Role, kind: EntryKind) -> bool:
    return kind in WRITABLE_KINDS[role]


def check_may_write(role: Role, kind: EntryKind) -> None:
    if not may_write(role, kind):
        allowed = ", ".join(sorted(f"ENTRY_KIND_{k.name}" for k in WRITABLE_KINDS[role]))
        raise PermissionDenied(
            f"ROLE_{role.name} may not write ENTRY_KIND_{kind.name} entries; it may write {allowed}",
            reason=ErrorReason.KIND_NOT_PERMITTED_FOR_ROLE,
            metadata={"role": role.value, "kind": kind.value},
        )


def check_record_author(role: Role, record: ResearchRecord) -> None:
    """Refuse a record its author's role may write the kind of but not this one: an objection is an auditor's
    from its audit, or the supervisor's from a citation check of its code, never the other way round."""
    if not isinstance(record, Objection):
        return
    if role is Role.SUPERVISOR and record.check is None:
        problem = "ROLE_SUPERVISOR raises objections only from its citation checks (check), never as an audit"
    elif role is not Role.SUPERVISOR and record.check is not None:
        problem = f"ROLE_{role.name} raises objections from its audit (audit_ref), never as a citation check"
    else:
        return
    raise PermissionDenied(
        problem,
        reason=ErrorReason.KIND_NOT_PERMITTED_FOR_ROLE,
        metadata={"role": role.value, "kind": EntryKind.OBJECTION.value},
    )
