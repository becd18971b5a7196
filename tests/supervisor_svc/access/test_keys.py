"""`quarry keys add|list|revoke` on the supervisor's database (SQLite and PostgreSQL), and the access tables."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from quarry.api_auth import ALL_ROLES, api_key_digest
from quarry.cli.commands import run
from quarry.config import ConfigurationError, QuarrySettings, SupervisorSettings
from quarry.db import create_engine
from quarry.identity import ApiRole
from quarry.v1 import campaign_pb2, supervisor_pb2
from supervisor_svc.access.guard import CAMPAIGN_ACCESS, SUPERVISOR_ACCESS, api_guard
from supervisor_svc.schema import api_keys


def test_add_list_and_revoke_keep_only_digests_and_print_the_key_once(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QUARRY_SUPERVISOR_DATABASE_URL", database_url)
    assert run(["keys", "add", "carol-laptop", "--role", "researcher", "--role", "reader", "--principal", "carol"]) == 0
    key = capsys.readouterr().out.strip()
    assert run(["keys", "add", "carol-phone", "--role", "approver", "--principal", "carol"]) == 0
    capsys.readouterr()
    assert run(["keys", "add", "carol-laptop", "--role", "reader"]) == 1
    assert "a key named 'carol-laptop' exists already" in capsys.readouterr().err

    assert run(["keys", "list"]) == 0
    listed = capsys.readouterr().out
    assert key not in listed
    [laptop] = [line.split() for line in listed.splitlines() if line.startswith("carol-laptop")]
    assert laptop[1:3] == ["carol", "reader+researcher"] and laptop[-1] == "-"

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = {row.name: row for row in connection.execute(sa.select(api_keys))}
    finally:
        engine.dispose()
    assert bytes(rows["carol-laptop"].digest) == api_key_digest(key)
    assert all(key not in str(tuple(row)) for row in rows.values()), "the key itself is stored nowhere"

    assert run(["keys", "revoke", "carol-laptop"]) == 0
    assert run(["keys", "revoke", "nobody"]) == 1
    capsys.readouterr()
    assert run(["keys", "list"]) == 0
    [laptop] = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("carol-laptop")]
    assert laptop[-1] != "-", "listed with the time it was revoked"


def test_every_public_method_is_in_its_table_and_each_role_gets_what_it_should() -> None:
    for service, table in [("SupervisorService", SUPERVISOR_ACCESS), ("CampaignService", CAMPAIGN_ACCESS)]:
        descriptor = (supervisor_pb2 if service == "SupervisorService" else campaign_pb2).DESCRIPTOR
        assert set(table) == {method.name for method in descriptor.services_by_name[service].methods}
    for method in ["GetRun", "ListRuns", "StreamRun"]:
        assert SUPERVISOR_ACCESS[method] == ALL_ROLES
    for method in ["GetCampaign", "ListCampaigns", "StreamCampaign", "ListLedgerRows"]:
        assert CAMPAIGN_ACCESS[method] == ALL_ROLES
    assert SUPERVISOR_ACCESS["StartRun"] == SUPERVISOR_ACCESS["CancelRun"] == {ApiRole.RESEARCHER}
    assert SUPERVISOR_ACCESS["ApproveRun"] == SUPERVISOR_ACCESS["RejectRun"] == {ApiRole.APPROVER}
    for method in ["StartCampaign", "PauseCampaign", "ResumeCampaign", "StopCampaign", "SendDirective"]:
        assert CAMPAIGN_ACCESS[method] == {ApiRole.OPERATOR}


async def _no_keys() -> dict[bytes, object]:
    return {}


def test_certificate_names_need_mutual_tls_and_an_open_api_needs_no_monitor(tmp_path: Path) -> None:
    common = QuarrySettings(data_dir=tmp_path)
    named = SupervisorSettings(client_certificates="cn:ci=ci:reader")
    with pytest.raises(ConfigurationError, match="mutual TLS is not on"):
        api_guard(named, common, {}, _no_keys)  # type: ignore[arg-type]
    open_with_campaigns = SupervisorSettings(open_api=True, monitor_address="127.0.0.1:7413")
    with pytest.raises(ConfigurationError, match="QUARRY_SUPERVISOR_OPEN_API is refused while campaigns can run code"):
        api_guard(open_with_campaigns, common, {}, _no_keys)  # type: ignore[arg-type]
