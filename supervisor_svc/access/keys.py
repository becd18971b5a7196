"""API keys kept in the supervisor's database: named, each a principal and its roles, stored as SHA-256
digests only. Plain functions over a connection, so `quarry keys` (synchronous, on the command line) and
the supervisor (through its Database) share them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from quarry.api_auth import ApiPrincipal, api_key_digest, new_api_key
from quarry.identity import ApiRole
from supervisor_svc.schema import api_keys

__all__ = ["KeyNameTaken", "StoredKey", "active_keys", "add_key", "list_keys", "revoke_key"]


class KeyNameTaken(ValueError):
    pass


@dataclass(frozen=True)
class StoredKey:
    name: str
    principal: str
    roles: frozenset[ApiRole]
    create_time: datetime
    revoke_time: datetime | None


def _roles(text: str) -> frozenset[ApiRole]:
    # Roles a later release may add are ignored by this one rather than failing every call.
    return frozenset(ApiRole(name) for name in text.split("+") if name in ApiRole.__members__.values())


def add_key(connection: Connection, name: str, principal: str, roles: frozenset[ApiRole]) -> str:
    """Store a new key and return it: the only time it exists outside the caller's hands."""
    if connection.execute(sa.select(api_keys.c.name).where(api_keys.c.name == name)).first() is not None:
        raise KeyNameTaken(f"a key named {name!r} exists already (revoked keys keep their names)")
    key = new_api_key()
    connection.execute(
        api_keys.insert().values(
            name=name,
            principal=principal,
            roles="+".join(sorted(roles)),
            digest=api_key_digest(key),
            create_time=datetime.now(UTC),
            revoke_time=None,
        )
    )
    return key


def list_keys(connection: Connection) -> list[StoredKey]:
    rows = connection.execute(sa.select(api_keys).order_by(api_keys.c.create_time, api_keys.c.name))
    return [StoredKey(r.name, r.principal, _roles(r.roles), r.create_time, r.revoke_time) for r in rows]


def revoke_key(connection: Connection, name: str) -> bool:
    """Revoke a key; False when no key has that name. Revoking twice keeps the first time."""
    found = connection.execute(sa.select(api_keys.c.revoke_time).where(api_keys.c.name == name)).first()
    if found is None:
        return False
    if found.revoke_time is None:
        connection.execute(api_keys.update().where(api_keys.c.name == name).values(revoke_time=datetime.now(UTC)))
    return True


def active_keys(connection: Connection) -> dict[bytes, ApiPrincipal]:
    """Every key not revoked: digest -> principal."""
    query = sa.select(api_keys.c.digest, api_keys.c.principal, api_keys.c.roles).where(api_keys.c.revoke_time.is_(None))
    return {bytes(r.digest): ApiPrincipal(r.principal, _roles(r.roles)) for r in connection.execute(query)}
