"""HTTP fetching that cannot be pointed at the inside of the network (SSRF).

Every TCP connection, including each hop of a redirect, resolves the host
itself, refuses addresses that are not public (loopback, private, link-local
such as the 169.254.169.254 metadata service, shared, reserved, multicast),
and connects to the address it checked, so a name that resolves differently a
moment later (DNS rebinding) cannot slip through. An allowlist admits chosen
`host:port` pairs or networks; tests open it for their fixture server only.

Bodies are read with `read_body`, which counts what arrives and what it
inflates to: a small compressed body cannot grow past the size limit in memory.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from quarry.recording import RecordingTransport

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
        if not 0 < port < 65536:  # httpx parses any number; the socket layer would raise past httpx's errors
            raise httpx.ConnectError(f"{host}:{port}: port {port} is out of range")
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
    except ValueError as error:  # UnicodeError: a label the IDNA codec refuses (empty, over 63 characters)
        raise httpx.ConnectError(f"cannot resolve {host}: not a valid host name ({error})") from error
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
        # Recorded inside a run's scope, and answered from the recording during a replay (quarry.recording).
        transport=RecordingTransport(GuardedTransport(policy)),
        follow_redirects=True,
        max_redirects=max_redirects,
        timeout=timeout,
        trust_env=False,
        # identity: well-behaved servers send the body as is; what others compress anyway, read_body
        # decodes within the size limit (httpx's own decoding would inflate each piece whole).
        headers={"user-agent": "quarry-research/0.1", "accept-encoding": "identity"},
    )


class BodyError(Exception):
    """A response body that is not read; the message says why (it follows the URL)."""


class BodyTooLarge(BodyError):
    """The body, as it arrives or as it inflates, passed the size limit."""


# Content codings read_body decodes, by name: zlib's wbits (deflate may also come without its zlib header).
_CODINGS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


class _Inflater:
    """One content coding, decoded a bounded amount at a time."""

    def __init__(self, coding: str) -> None:
        self._wbits = _CODINGS[coding]
        self._zlib = zlib.decompressobj(self._wbits)
        self._started = False

    def feed(self, data: bytes, limit: int) -> bytes:
        """At most `limit` decoded bytes of `data`; exactly `limit` means there may be more."""
        try:
            return self._decompress(data, limit)
        except zlib.error as error:
            if self._started or self._wbits != zlib.MAX_WBITS:
                raise BodyError(f"has a body that cannot be decoded ({error})") from error
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)  # deflate sent raw, without the zlib header
            try:
                return self._decompress(data, limit)
            except zlib.error as raw_error:
                raise BodyError(f"has a body that cannot be decoded ({raw_error})") from raw_error

    def _decompress(self, data: bytes, limit: int) -> bytes:
        if self._zlib.eof:
            return b""  # bytes after the end of the stream are counted as they arrive, not decoded
        output = self._zlib.decompress(data, limit)
        self._started = True
        return output


async def read_body(response: httpx.Response, max_bytes: int) -> bytes:
    """The decoded body of a streamed response, never holding more than `max_bytes` of it.

    httpx would inflate each piece of a compressed body whole (2.6 KB of gzip inside
    gzip becomes gigabytes in one step), so the raw bytes are decoded here instead,
    `max_bytes` at most per step. One gzip or deflate layer is read, as servers send
    it even to a client that asks for identity; stacked or other codings are refused.
    Raises BodyTooLarge past the limit (raw or decoded) and BodyError for what cannot be read.
    """
    codings = [
        coding.strip().lower()
        for coding in response.headers.get_list("content-encoding", split_commas=True)
        if coding.strip().lower() not in ("", "identity")
    ]
    if len(codings) > 1:
        raise BodyError(f"is sent with stacked content codings ({', '.join(codings)}), which are not read")
    if codings and codings[0] not in _CODINGS:
        raise BodyError(f"is sent with content coding {codings[0]!r}, which is not read")
    inflater = _Inflater(codings[0]) if codings else None
    body = bytearray()
    arrived = 0
    async for raw in response.aiter_raw():
        arrived += len(raw)
        if arrived > max_bytes:
            raise BodyTooLarge(f"is larger than {max_bytes} bytes")
        # One byte past the budget is enough to know the body is too large.
        body += inflater.feed(raw, max_bytes - len(body) + 1) if inflater is not None else raw
        if len(body) > max_bytes:
            raise BodyTooLarge(f"is larger than {max_bytes} bytes (decoded)")
    return bytes(body)
