"""HTTP fetching that cannot be pointed at the inside of the network (SSRF).

Every TCP connection, including each hop of a redirect, resolves the host
itself, refuses addresses that are not public (loopback, private, link-local
such as the 169.254.169.254 metadata service, shared, reserved, multicast),
and connects to the address it checked, so a name that resolves differently a
moment later (DNS rebinding) cannot slip through. An allowlist admits chosen
`host:port` pairs or networks; tests open it for their fixture server only.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class BlockedAddress(httpx.ConnectError):
    """The URL's host resolves only to addresses fetching may not reach."""


@dataclass(frozen=True)
class AddressPolicy:
    """Which addresses may be fetched: public ones, plus the allowlist."""

    # "10.1.2.3:8080", "127.0.0.1:41000" (one port), or "10.0.0.0/8" (any port).
    allow: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for entry in self.allow:
            _parse_entry(entry)  # fail at configuration time, not at the first fetch

    def permits(self, address: IPAddress, port: int) -> bool:
        for entry in self.allow:
            network, allowed_port = _parse_entry(entry)
            if address in network and allowed_port in (None, port):
                return True
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return self.permits(embedded, port)
        if isinstance(address, ipaddress.IPv6Address) and any(address in net for net in _TRANSLATION_NETWORKS):
            return False  # IPv4-compatible, local-use NAT64 or Teredo: where it leads cannot be checked
        return address.is_global and not address.is_multicast


# IPv6 ranges that stand for IPv4 hosts without a checkable embedding.
_TRANSLATION_NETWORKS = tuple(
    ipaddress.IPv6Network(net) for net in ("::/96", "64:ff9b:1::/48", "2001::/32", "100::/64")
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, well-known NAT64, 6to4), judged in its place."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def _parse_entry(entry: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int | None]:
    if "/" in entry:
        return ipaddress.ip_network(entry, strict=False), None
    host, _, port = entry.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"allowlist entry {entry!r} must be HOST:PORT or a CIDR network")
    return ipaddress.ip_network(host.strip("[]")), int(port)


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await _resolve(host, port)
        allowed = [address for address in addresses if self._policy.permits(address, port)]
        if not allowed:
            raise BlockedAddress(f"{host}:{port} resolves to {', '.join(map(str, addresses))}: not a public address")
        return await self._inner.connect_tcp(
            str(allowed[0]), port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


async def _resolve(host: str, port: int) -> Sequence[IPAddress]:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise httpx.ConnectError(f"cannot resolve {host}: {error.strerror}") from error
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a connection pool whose every connection passes the policy."""

    def __init__(self, policy: AddressPolicy) -> None:
        super().__init__(trust_env=False)  # a proxy from the environment would bypass the checks
        # httpx has no public hook for the network backend; its pool is replaced here.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=_GuardedBackend(policy),
        )


def guarded_client(policy: AddressPolicy, *, timeout: float = 20.0, max_redirects: int = 5) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=GuardedTransport(policy),
        follow_redirects=True,
        max_redirects=max_redirects,
        timeout=timeout,
        trust_env=False,
        # identity: the size limit then counts what arrives, so a small compressed body cannot inflate.
        headers={"user-agent": "quarry-research/0.1", "accept-encoding": "identity"},
    )
