"""The public API's credentials as configured: static keys, certificate names, roles, and the key cache."""

from __future__ import annotations

import hashlib

import pytest

from quarry.api_auth import (
    ALL_ROLES,
    ApiKeys,
    ApiPrincipal,
    access_table,
    api_key_digest,
    new_api_key,
    parse_api_keys,
    parse_client_certificates,
    static_key_entry,
)
from quarry.config import ConfigurationError
from quarry.identity import ApiRole

DIGEST = "ab" * 32


def test_a_new_key_is_recognizable_and_carries_256_random_bits() -> None:
    key = new_api_key()
    assert key.startswith("qk_") and len(key) == 3 + 43 and key != new_api_key()
    assert api_key_digest(key) == hashlib.sha256(key.encode()).digest()


def test_static_keys_parse_to_principals_with_roles() -> None:
    keys = parse_api_keys(f" alice:reader+operator=sha256:{DIGEST} , ci:researcher=sha256:{'cd' * 32},")
    assert keys == {
        bytes.fromhex(DIGEST): ApiPrincipal("alice", frozenset({ApiRole.READER, ApiRole.OPERATOR})),
        bytes.fromhex("cd" * 32): ApiPrincipal("ci", frozenset({ApiRole.RESEARCHER})),
    }
    key = new_api_key()
    assert parse_api_keys(static_key_entry("local", ALL_ROLES, key)) == {
        api_key_digest(key): ApiPrincipal("local", ALL_ROLES)
    }
    assert parse_api_keys("") == {}


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        (f"alice=sha256:{DIGEST}", "is not PRINCIPAL:ROLE+ROLE"),
        (f"alice:admin=sha256:{DIGEST}", "unknown role 'admin'; one of: reader, researcher, operator, approver"),
        ("alice:reader", "is not PRINCIPAL:ROLE+ROLE=sha256:HEX"),
        ("alice:reader=sha256:abc", "the key of alice must be sha256:<64 hex digits>"),
        (f"alice:reader={DIGEST}", "the key of alice must be sha256:<64 hex digits>"),
        ("alice:reader=sha256:" + "zz" * 32, "the digest of alice is not hexadecimal"),
        (f":reader=sha256:{DIGEST}", "is not PRINCIPAL:ROLE+ROLE"),
    ],
)
def test_a_bad_static_key_is_one_clear_configuration_error(entry: str, said: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_api_keys(entry)
    assert str(raised.value).startswith("QUARRY_SUPERVISOR_API_KEYS: ") and said in str(raised.value)


def test_certificate_names_map_to_principals() -> None:
    names = parse_client_certificates("cn:ci.example.com=ci:researcher+reader")
    assert names == {"ci.example.com": ApiPrincipal("ci", frozenset({ApiRole.RESEARCHER, ApiRole.READER}))}
    for entry in ["ci.example.com=ci:reader", "cn:=ci:reader", "cn:x", "cn:x=ci"]:
        with pytest.raises(ConfigurationError, match="QUARRY_SUPERVISOR_CLIENT_CERTIFICATES"):
            parse_client_certificates(entry)


def test_an_access_table_opens_reads_to_every_role_and_each_other_method_to_the_roles_that_list_it() -> None:
    table = access_table(["Get"], {ApiRole.OPERATOR: ["Start", "Stop"], ApiRole.APPROVER: ["Stop"]})
    assert table == {
        "Get": ALL_ROLES,
        "Start": frozenset({ApiRole.OPERATOR}),
        "Stop": frozenset({ApiRole.OPERATOR, ApiRole.APPROVER}),
    }


class _Stored:
    """Stored keys as a loader reads them, counting the reads."""

    def __init__(self) -> None:
        self.keys: dict[bytes, ApiPrincipal] = {}
        self.reads = 0

    async def __call__(self) -> dict[bytes, ApiPrincipal]:
        self.reads += 1
        return dict(self.keys)


async def test_known_keys_cost_no_read_and_an_unknown_one_reloads_at_most_once_per_interval() -> None:
    stored, static_key, stored_key = _Stored(), new_api_key(), new_api_key()
    stored.keys[api_key_digest(stored_key)] = ApiPrincipal("bob", frozenset({ApiRole.READER}))
    keys = ApiKeys({api_key_digest(static_key): ApiPrincipal("ci", ALL_ROLES)}, stored, refresh_seconds=3600)
    assert (await keys.identify(static_key)) == ApiPrincipal("ci", ALL_ROLES)
    assert (await keys.identify(stored_key)).name == "bob"  # type: ignore[union-attr]
    for _ in range(100):
        await keys.identify(stored_key)
    assert stored.reads == 1, "the first call loads the cache; the others read none"
    assert await keys.identify("") is None


async def test_a_key_added_since_the_last_read_works_at_once_and_unknown_keys_reload_at_most_once_per_interval() -> (
    None
):
    stored = _Stored()
    keys = ApiKeys({}, stored, refresh_seconds=3600, miss_reload_seconds=0)
    assert await keys.identify("qk_unknown") is None
    added = new_api_key()
    stored.keys[api_key_digest(added)] = ApiPrincipal("carol", frozenset({ApiRole.RESEARCHER}))
    assert await keys.identify(added) == ApiPrincipal("carol", frozenset({ApiRole.RESEARCHER}))
    patient = ApiKeys({}, stored, refresh_seconds=3600, miss_reload_seconds=3600)
    for _ in range(50):
        assert await patient.identify("qk_unknown") is None
    assert stored.reads == 3 + 1, "a flood of unknown keys reloads no more than the interval allows"
