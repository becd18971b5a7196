"""Who calls the public API (SupervisorService, CampaignService), proven, and what their roles allow.

A caller presents an API key as a bearer token (or, under mutual TLS, a client certificate whose
common name is mapped to a principal). A key names a principal and holds roles; each method of the
public services is allowed to some roles, in one table per service. A method missing from its
table is refused to everyone, as in `quarry.mesh_auth`. Servers hold keys only as SHA-256 digests.

The authenticated principal reaches the domain code through `current_principal()`, never through
the request.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from quarry.config import ConfigurationError
from quarry.errors import ErrorReason, PermissionDenied, Unauthenticated
from quarry.identity import ApiRole
from quarry.mesh_auth import token_digest
from quarry.security import MethodGuard, certificate_names, presented_token

__all__ = [
    "ALL_ROLES",
    "API_KEY_FILE",
    "ApiAccess",
    "ApiAuthentication",
    "ApiKeys",
    "ApiPrincipal",
    "KeyLoader",
    "access_table",
    "api_key_digest",
    "current_principal",
    "current_principal_name",
    "new_api_key",
    "parse_api_keys",
    "parse_client_certificates",
    "parse_roles",
    "static_key_entry",
]

log = logging.getLogger(__name__)

API_KEY_PREFIX = "qk_"
# Where `quarry up` writes the key of its principal "local" (mode 0600) in the data directory, and the
# command line looks for it.
API_KEY_FILE = "api-key"
_DIGEST_PREFIX = "sha256:"
_CN_PREFIX = "cn:"


ALL_ROLES = frozenset(ApiRole)

# Method name -> the roles that may call it.
ApiAccess = Mapping[str, frozenset[ApiRole]]


def access_table(reads: Iterable[str], by_role: Mapping[ApiRole, Iterable[str]]) -> ApiAccess:
    """A service's table: `reads` open to every role, each other method to the roles that list it."""
    table: dict[str, frozenset[ApiRole]] = {method: ALL_ROLES for method in reads}
    for role, methods in by_role.items():
        for method in methods:
            table[method] = table.get(method, frozenset()) | {role}
    return table


@dataclass(frozen=True)
class ApiPrincipal:
    """An authenticated caller: its name (what runs record as created_by) and its roles."""

    name: str
    roles: frozenset[ApiRole]

    def describe_roles(self) -> str:
        return "+".join(sorted(self.roles)) or "none"


def new_api_key() -> str:
    """A fresh API key: a recognizable prefix and 256 random bits, URL-safe."""
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def api_key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_roles(text: str, where: str) -> frozenset[ApiRole]:
    """ROLE+ROLE (or ROLE alone) as roles; `where` names the setting or argument in errors."""
    roles = set()
    for name in text.split("+"):
        try:
            roles.add(ApiRole(name.strip()))
        except ValueError:
            known = ", ".join(role.value for role in ApiRole)
            raise ConfigurationError(f"{where}: unknown role {name.strip()!r}; one of: {known}") from None
    return frozenset(roles)


def _principal(text: str, where: str) -> ApiPrincipal:
    name, separator, roles = text.partition(":")
    if not separator or not name.strip() or not roles.strip():
        raise ConfigurationError(f"{where}: {text!r} is not PRINCIPAL:ROLE+ROLE")
    return ApiPrincipal(name.strip(), parse_roles(roles, where))


def parse_api_keys(text: str, setting: str = "QUARRY_SUPERVISOR_API_KEYS") -> dict[bytes, ApiPrincipal]:
    """Entries `PRINCIPAL:ROLE+ROLE=sha256:<64 hex>`, comma-separated: digest -> principal."""
    keys = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        who, separator, credential = entry.rpartition("=")
        if not separator:
            raise ConfigurationError(f"{setting}: {entry!r} is not PRINCIPAL:ROLE+ROLE=sha256:HEX")
        principal = _principal(who, setting)
        hex_digest = credential.strip().removeprefix(_DIGEST_PREFIX)
        if not credential.strip().startswith(_DIGEST_PREFIX) or len(hex_digest) != 64:
            raise ConfigurationError(
                f"{setting}: the key of {principal.name} must be sha256:<64 hex digits>, the digest of the key"
            )
        try:
            keys[bytes.fromhex(hex_digest)] = principal
        except ValueError:
            raise ConfigurationError(f"{setting}: the digest of {principal.name} is not hexadecimal") from None
    return keys


def static_key_entry(principal: str, roles: Iterable[ApiRole], key: str) -> str:
    """The QUARRY_SUPERVISOR_API_KEYS entry of `key` (its digest, never the key)."""
    return f"{principal}:{'+'.join(sorted(roles))}={token_digest(key)}"


def parse_client_certificates(
    text: str, setting: str = "QUARRY_SUPERVISOR_CLIENT_CERTIFICATES"
) -> dict[str, ApiPrincipal]:
    """Entries `cn:NAME=PRINCIPAL:ROLE+ROLE`, comma-separated: certificate common name -> principal."""
    names = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        credential, separator, who = entry.partition("=")
        name = credential.strip().removeprefix(_CN_PREFIX)
        if not separator or not credential.strip().startswith(_CN_PREFIX) or not name:
            raise ConfigurationError(f"{setting}: {entry!r} is not cn:NAME=PRINCIPAL:ROLE+ROLE")
        names[name] = _principal(who, setting)
    return names


# Stored keys, as a loader reads them all: digest -> principal (revoked keys left out).
KeyLoader = Callable[[], Awaitable[Mapping[bytes, ApiPrincipal]]]


class ApiKeys:
    """The keys a server accepts: static ones, and stored ones through a cache.

    A known key costs a dictionary lookup. An unknown one reloads the stored keys (at most once per
    `miss_reload_seconds`, so a key just added works at once and a flood of bad keys costs little);
    the cache is also reloaded when older than `refresh_seconds`, which is how revocation applies.
    """

    def __init__(
        self,
        static: Mapping[bytes, ApiPrincipal],
        loader: KeyLoader | None = None,
        *,
        refresh_seconds: float = 5.0,
        miss_reload_seconds: float = 1.0,
    ) -> None:
        self._static = dict(static)
        self._loader = loader
        self._stored: Mapping[bytes, ApiPrincipal] = {}
        self._refresh_seconds = refresh_seconds
        self._miss_reload_seconds = miss_reload_seconds
        self._loaded_at = -float("inf")
        self._lock = asyncio.Lock()

    async def identify(self, key: str) -> ApiPrincipal | None:
        if not key:
            return None
        # Dictionary lookups by digest: a secret-dependent timing would reveal a digest, not a key.
        digest = api_key_digest(key)
        found = self._static.get(digest)  # static keys need no database, so they work while it is away
        if found is not None or self._loader is None:
            return found
        if time.monotonic() - self._loaded_at >= self._refresh_seconds:
            await self._reload(self._refresh_seconds)
        found = self._stored.get(digest)
        if found is None:
            await self._reload(self._miss_reload_seconds)
            found = self._stored.get(digest)
        return found

    async def _reload(self, older_than: float) -> None:
        assert self._loader is not None
        async with self._lock:
            # Another call may have reloaded while this one waited.
            if time.monotonic() - self._loaded_at < older_than:
                return
            self._stored = await self._loader()
            self._loaded_at = time.monotonic()


_PRINCIPAL: contextvars.ContextVar[ApiPrincipal | None] = contextvars.ContextVar("quarry_api_principal", default=None)


def current_principal() -> ApiPrincipal | None:
    """The authenticated principal of the current public API call; None outside one."""
    return _PRINCIPAL.get()


def current_principal_name() -> str:
    """The name of the current call's principal, as runs and campaigns record it ("" outside a call)."""
    principal = _PRINCIPAL.get()
    return principal.name if principal else ""


class ApiAuthentication(MethodGuard):
    """Authenticates every call to the services in `access` and refuses what the caller's roles do not allow.

    `anonymous`: the principal every caller is when the API runs open (no credential checked).
    Health, reflection and diagnostics, and services not named, stay open.
    """

    def __init__(
        self,
        access: Mapping[str, ApiAccess],
        keys: ApiKeys,
        *,
        certificates: Mapping[str, ApiPrincipal] | None = None,
        anonymous: ApiPrincipal | None = None,
        how_to_get_a_key: str = "",
    ) -> None:
        super().__init__(access)
        self._keys = keys
        self._certificates = dict(certificates or {})
        self._anonymous = anonymous
        self._hint = how_to_get_a_key

    async def authenticate(self, context: Any) -> ApiPrincipal:
        if self._anonymous is not None:
            return self._anonymous
        token = presented_token(context)
        principal = await self._keys.identify(token)
        if principal is None and self._certificates:
            principal = next(
                (self._certificates[n] for n in certificate_names(context) if n in self._certificates), None
            )
        if principal is None:
            problem = "the API key presented is not one this server accepts" if token else "this call needs an API key"
            raise Unauthenticated(f"{problem}: {self._hint}", reason=ErrorReason.BEARER_TOKEN_INVALID)
        return principal

    def checker(self, method: str, allowed: frozenset[ApiRole]) -> Callable[[Any], Awaitable[None]]:
        """The check that guards `method`, allowed to `allowed`: authenticates, then compares roles."""

        async def check(context: Any) -> None:
            principal = await self.authenticate(context)
            if not principal.roles & allowed:
                permitted = ", ".join(sorted(allowed)) or "no one"
                raise PermissionDenied(
                    f"{principal.name} (roles: {principal.describe_roles()}) may not call {method}; "
                    f"it is for: {permitted}",
                    reason=ErrorReason.ROLE_NOT_PERMITTED,
                    metadata={"principal": principal.name, "method": method, "permitted": permitted},
                )
            # The handler runs in this task, so it (and the domain code it calls) sees the principal.
            _PRINCIPAL.set(principal)

        return check
