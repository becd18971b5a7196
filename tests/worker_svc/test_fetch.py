"""The guarded fetcher reaches the allowlisted fixture web and nothing else inside the network.

Refused addresses are refused before any connection is attempted: these tests
send no traffic to private or link-local ranges.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.fakes.web_server import FixtureWeb
from worker_svc.web.fetch import AddressPolicy, BlockedAddress, guarded_client


@pytest.fixture
async def client(site: FixtureWeb) -> AsyncIterator[httpx.AsyncClient]:
    async with guarded_client(AddressPolicy(allow=(f"127.0.0.1:{site.port}",)), timeout=5) as http:
        yield http


async def test_the_allowlisted_fixture_is_fetched(client: httpx.AsyncClient, site: FixtureWeb) -> None:
    response = await client.get(f"{site.base_url}/article.html")
    assert response.status_code == 200
    assert "330 metres" in response.text
    # A name that resolves to the allowlisted address is fine too.
    assert (await client.get(f"http://localhost:{site.port}/article.html")).status_code == 200


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/",  # loopback, another port
        "http://127.1.2.3/",
        "http://10.0.0.1/",  # private
        "http://192.168.1.1/",
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata (link-local)
        "http://100.100.100.200/",  # shared address space (another metadata service)
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",  # IPv4-mapped loopback
        "http://[fd00:ec2::254]/",  # IPv6 metadata (unique local)
        "http://0.0.0.0/",
        "http://[64:ff9b::a00:1]/",  # NAT64 of 10.0.0.1
        "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of the metadata service
        "http://[64:ff9b:1::a00:1]/",  # local-use NAT64
        "http://[2002:a00:1::1]/",  # 6to4 of 10.0.0.1
        "http://[::a00:1]/",  # IPv4-compatible
        "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",  # Teredo
    ],
)
async def test_internal_addresses_are_refused(client: httpx.AsyncClient, url: str) -> None:
    with pytest.raises(BlockedAddress):
        await client.get(url)


async def test_names_resolving_inside_are_refused(client: httpx.AsyncClient) -> None:
    with pytest.raises(BlockedAddress):
        await client.get("http://localhost:9/")


@pytest.mark.parametrize("target", ["http://127.0.0.1:9/", "http://10.0.0.1/", "http://169.254.169.254/"])
async def test_redirects_into_the_network_are_refused(client: httpx.AsyncClient, site: FixtureWeb, target: str) -> None:
    with pytest.raises(BlockedAddress):
        await client.get(f"{site.base_url}/redirect", params={"to": target})
    assert [hit.split("?")[0] for hit in site.hits] == ["/redirect"], "only the redirect itself was served"


def test_policy_rules() -> None:
    policy = AddressPolicy(allow=("127.0.0.1:8000", "10.20.0.0/16"))
    assert policy.permits(ipaddress.ip_address("93.184.216.34"), 80)
    assert policy.permits(ipaddress.ip_address("127.0.0.1"), 8000)
    assert not policy.permits(ipaddress.ip_address("127.0.0.1"), 8001)
    assert policy.permits(ipaddress.ip_address("10.20.3.4"), 443)
    assert not policy.permits(ipaddress.ip_address("10.21.0.1"), 443)
    assert not policy.permits(ipaddress.ip_address("224.0.0.1"), 80)
    assert policy.permits(ipaddress.ip_address("64:ff9b::5db8:d822"), 80), "NAT64 of a public address is fine"
    assert policy.permits(ipaddress.ip_address("2606:4700::1111"), 443)
    with pytest.raises(ValueError):
        AddressPolicy(allow=("not-an-entry",))
