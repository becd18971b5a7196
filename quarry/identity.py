"""Who acts in the mesh: principals and the roles they act in."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(enum.StrEnum):
    SUPERVISOR = "supervisor"
    RESEARCHER = "researcher"
    VERIFIER = "verifier"


@dataclass(frozen=True)
class Principal:
    principal_id: str
    role: Role
