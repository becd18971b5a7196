"""Who acts in the mesh: principals and the roles they act in."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(enum.StrEnum):
    SUPERVISOR = "supervisor"
    RESEARCHER = "researcher"
    # The claim-verifier: judges one finding, blind.
    VERIFIER = "verifier"
    ENGINEER = "engineer"
    CITATION_AUDITOR = "citation_auditor"
    ADJUDICATOR = "adjudicator"
    # Checks that a cited paper exists and is what the finding's source says, blind.
    BIBLIOGRAPHIC_VERIFIER = "bibliographic_verifier"
    # Screens the literature: candidate sources, each with why it is relevant.
    SCOUT = "scout"
    # Takes claim or experiment records out of one source, each quoted with its location.
    EXTRACTOR = "extractor"
    # Writes a campaign's report from its ledger; every figure it writes is checked against the ledger.
    WRITER = "writer"


@dataclass(frozen=True)
class Principal:
    principal_id: str
    role: Role


class MeshRole(enum.StrEnum):
    """What a process is in the mesh, proven by its mesh credential: the authority its calls carry.

    A thread author's Role is claimed in a request; a MeshRole is authenticated, and decides which
    Roles a caller may act in.
    """

    SUPERVISOR = "supervisor"
    WORKER = "worker"


class ApiRole(enum.StrEnum):
    """What a principal may do with the public API. Every role also reads."""

    READER = "reader"  # Get/List/Stream runs and campaigns, ListLedgerRows
    RESEARCHER = "researcher"  # StartRun, CancelRun
    # StartCampaign, Pause/Resume/Stop, SendDirective: code execution on the monitor's host.
    OPERATOR = "operator"
    APPROVER = "approver"  # ApproveRun, RejectRun
