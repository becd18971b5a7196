"""Authentication between Quarry's own services: who is calling, proven, and what that caller may do.

Every process presents one secret, its mesh token, as a bearer token on its calls to the other
services. A server knows its peers only by the SHA-256 digest of their tokens, so no process holds
a credential it could use to pass for another: a worker can check the supervisor's calls but cannot
make them. Under mutual TLS a peer may be named by its certificate's common name instead.

The authenticated role of the caller (a MeshRole) is what a service's access table and domain
checks read, through `current_caller()`; the roles a request claims are checked against it.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quarry.config import ConfigurationError, QuarrySettings
from quarry.errors import ErrorReason, PermissionDenied, Unauthenticated
from quarry.identity import MeshRole
from quarry.security import MethodGuard, Tls, certificate_names, presented_token

__all__ = [
    "Access",
    "MeshAuthentication",
    "MeshKeys",
    "MeshPeer",
    "MeshPeers",
    "current_caller",
    "mesh_guard",
    "new_token",
    "token_digest",
]

log = logging.getLogger(__name__)

# Method name (e.g. "Append") -> the mesh roles that may call it. A method missing from its service's
# table is refused to everyone: a new RPC is closed until someone decides who may call it.
Access = Mapping[str, frozenset[MeshRole]]

_DIGEST_PREFIX = "sha256:"
_CN_PREFIX = "cn:"


def new_token() -> str:
    """A fresh mesh token: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """How a server names the peer whose token this is: "sha256:" and the hex digest."""
    return _DIGEST_PREFIX + _digest(token).hex()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class MeshPeer:
    """One accepted credential: a token digest or a certificate common name, and the role it proves."""

    role: MeshRole
    digest: bytes = b""
    common_name: str = ""

    def render(self) -> str:
        credential = _DIGEST_PREFIX + self.digest.hex() if self.digest else _CN_PREFIX + self.common_name
        return f"{self.role.value}={credential}"


def _parse_peer(entry: str) -> MeshPeer:
    role_name, separator, credential = entry.partition("=")
    roles = ", ".join(role.value for role in MeshRole)
    if not separator:
        raise ConfigurationError(f"QUARRY_MESH_PEERS: {entry!r} is not ROLE=sha256:HEX or ROLE=cn:NAME")
    try:
        role = MeshRole(role_name.strip())
    except ValueError:
        raise ConfigurationError(f"QUARRY_MESH_PEERS: unknown role {role_name.strip()!r}; one of: {roles}") from None
    credential = credential.strip()
    if credential.startswith(_CN_PREFIX) and credential[len(_CN_PREFIX) :]:
        return MeshPeer(role, common_name=credential[len(_CN_PREFIX) :])
    hex_digest = credential.removeprefix(_DIGEST_PREFIX)
    if not credential.startswith(_DIGEST_PREFIX) or len(hex_digest) != 64:
        raise ConfigurationError(
            f"QUARRY_MESH_PEERS: the credential of {role.value} must be sha256:<64 hex digits> "
            "(the digest of its QUARRY_MESH_TOKEN) or cn:<certificate common name>"
        )
    try:
        return MeshPeer(role, digest=bytes.fromhex(hex_digest))
    except ValueError:
        raise ConfigurationError(f"QUARRY_MESH_PEERS: the digest of {role.value} is not hexadecimal") from None


@dataclass(frozen=True)
class MeshPeers:
    """The credentials a server accepts, each proving one role; several per role allow rotation."""

    peers: tuple[MeshPeer, ...] = ()

    @classmethod
    def parse(cls, text: str) -> MeshPeers:
        return cls(tuple(_parse_peer(entry) for entry in text.split(",") if entry.strip()))

    @classmethod
    def of_tokens(cls, tokens: Iterable[tuple[MeshRole, str]]) -> MeshPeers:
        return cls(tuple(MeshPeer(role, digest=_digest(token)) for role, token in tokens))

    def render(self) -> str:
        """The QUARRY_MESH_PEERS value that parses back to these peers."""
        return ",".join(peer.render() for peer in self.peers)

    def __bool__(self) -> bool:
        return bool(self.peers)

    def identify(self, token: str, common_names: Sequence[str] = ()) -> MeshRole | None:
        """The role a presented token (or, failing that, a verified certificate name) proves, if any."""
        if token:
            presented = _digest(token)
            for peer in self.peers:
                if peer.digest and hmac.compare_digest(peer.digest, presented):
                    return peer.role
        for peer in self.peers:
            if peer.common_name and peer.common_name in common_names:
                return peer.role
        return None


@dataclass(frozen=True)
class MeshKeys:
    """A token for every mesh role: what `quarry up` hands its services, and `quarry mesh keys` prints."""

    tokens: Mapping[MeshRole, str]

    @classmethod
    def generate(cls) -> MeshKeys:
        return cls({role: new_token() for role in MeshRole})

    def peers(self) -> MeshPeers:
        return MeshPeers.of_tokens(self.tokens.items())

    def environment(self, role: MeshRole | None) -> dict[str, str]:
        """The mesh settings of a process that calls others as `role` (None: one that calls no one).

        Every process learns every role's digest (its access table decides what each may do), and
        only its own token.
        """
        own = {"QUARRY_MESH_TOKEN": self.tokens[role]} if role else {}
        return {"QUARRY_MESH_PEERS": self.peers().render(), "QUARRY_MESH_INSECURE": "false", **own}


_CALLER: contextvars.ContextVar[MeshRole | None] = contextvars.ContextVar("quarry_mesh_caller", default=None)


def current_caller() -> MeshRole | None:
    """The authenticated mesh role of the current RPC's caller; None when the service runs unauthenticated."""
    return _CALLER.get()


def _access_check(peers: MeshPeers, allowed: frozenset[MeshRole], method: str) -> Callable[[Any], None]:
    def check(context: Any) -> None:
        caller = peers.identify(presented_token(context), certificate_names(context))
        if caller is None:
            raise Unauthenticated(
                f"{method} needs a mesh credential this service accepts (QUARRY_MESH_TOKEN of a peer it trusts)",
                reason=ErrorReason.MESH_CREDENTIAL_INVALID,
            )
        if caller not in allowed:
            permitted = ", ".join(sorted(role.value for role in allowed)) or "no one"
            raise PermissionDenied(
                f"the {caller.value} may not call {method}; it is for: {permitted}",
                reason=ErrorReason.CALLER_NOT_PERMITTED,
                metadata={"caller": caller.value, "method": method},
            )
        # The handler runs in this task, so it (and the domain code it calls) sees the caller.
        _CALLER.set(caller)

    return check


class MeshAuthentication(MethodGuard):
    """Authenticates every call to the services in `access` and refuses roles their table does not allow.

    Health and reflection, and services not named, stay open.
    """

    def __init__(self, peers: MeshPeers, access: Mapping[str, Access]) -> None:
        super().__init__(access)
        self._peers = peers

    def checker(self, method: str, allowed: frozenset[MeshRole]) -> Callable[[Any], None]:
        return _access_check(self._peers, allowed, method)


def mesh_guard(common: QuarrySettings, access: Mapping[str, Access], service: str) -> MeshAuthentication | None:
    """The authentication an internal service runs with, as configured; None when it runs open.

    Open only when QUARRY_MESH_INSECURE says so: an internal service without peers refuses to start.
    """
    peers = MeshPeers.parse(common.mesh_peers)
    tls = Tls.from_settings(common)
    if any(peer.common_name for peer in peers.peers) and not (tls and tls.require_client_certificate):
        # Without verified client certificates a common name proves nothing.
        raise ConfigurationError("QUARRY_MESH_PEERS names a peer by certificate (cn:) but mutual TLS is not on")
    if peers:
        return MeshAuthentication(peers, access)
    if not common.mesh_insecure:
        raise ConfigurationError(
            f"the {service} service needs QUARRY_MESH_PEERS (who may call it) or, to let anyone who can reach "
            "it call it, QUARRY_MESH_INSECURE=true; `quarry up` sets the peers itself, and `quarry mesh keys` "
            "makes them for a deployment"
        )
    log.warning("mesh authentication is off (QUARRY_MESH_INSECURE): anyone who can reach %s may call it", service)
    return None
