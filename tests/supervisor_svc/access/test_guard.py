"""The public API over a real supervisor process: every caller authenticated, every method checked against
the caller's roles, the principal recorded; stored keys work at once and stop working once revoked."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.api_auth import new_api_key, static_key_entry
from quarry.clients.campaigns import CampaignsClient
from quarry.clients.channels import open_channel
from quarry.clients.runs import RunsClient
from quarry.config import QuarrySettings, SupervisorSettings
from quarry.identity import ApiRole
from supervisor_svc.service import build_host as build_supervisor
from tests.conftest import ServiceProcess, reusable_port, start_service, stop_service
from tests.rpc import error_reason, expect_error
from tests.supervisor_svc.campaign_loops import campaign_spec

KEYS = {role: new_api_key() for role in ApiRole}
PRINCIPALS = {ApiRole.READER: "rita", ApiRole.RESEARCHER: "rob", ApiRole.OPERATOR: "ops", ApiRole.APPROVER: "ann"}


@pytest.fixture(scope="module")
def supervisor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, Path]]:
    """A supervisor that can run campaigns (a monitor address: nothing listens there, so the preflight refuses
    every campaign that gets past the guard) and accepts one key per role."""
    data_dir = tmp_path_factory.mktemp("guarded")
    env = {
        "QUARRY_DATA_DIR": str(data_dir),
        "QUARRY_LOG_LEVEL": "WARNING",
        "QUARRY_SHUTDOWN_GRACE_SECONDS": "1",
        "QUARRY_SUPERVISOR_API_KEYS": ",".join(
            static_key_entry(PRINCIPALS[role], {role}, key) for role, key in KEYS.items()
        ),
        "QUARRY_SUPERVISOR_API_KEY_REFRESH_SECONDS": "0.2",
        "QUARRY_SUPERVISOR_MONITOR_ADDRESS": f"127.0.0.1:{reusable_port()}",
        "QUARRY_SUPERVISOR_SCRATCHPAD_ADDRESS": f"127.0.0.1:{reusable_port()}",
        "QUARRY_SUPERVISOR_WORKER_ADDRESSES": f"127.0.0.1:{reusable_port()}",
    }
    service = start_service("supervisor", env, data_dir)
    try:
        yield service, data_dir
    finally:
        stop_service(service)


async def test_a_call_without_a_key_is_refused_and_told_where_to_get_one(
    supervisor: tuple[ServiceProcess, Path],
) -> None:
    service, data_dir = supervisor
    for key in ("", "qk_not-a-key-anyone-holds"):
        async with CampaignsClient.connect(service.address, api_key=key) as campaigns:
            error = await expect_error(campaigns.start_campaign(campaign_spec()), grpc.StatusCode.UNAUTHENTICATED)
        assert error_reason(error) == "BEARER_TOKEN_INVALID"
        said = error.details() or ""
        assert str(data_dir / "api-key") in said and "QUARRY_API_KEY" in said and "quarry keys add" in said
        async with RunsClient.connect(service.address, api_key=key) as runs:
            await expect_error(runs.list_runs(), grpc.StatusCode.UNAUTHENTICATED)
    async with open_channel(service.address) as channel:  # probes need no key
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING


async def test_each_role_may_call_its_methods_and_every_role_reads(supervisor: tuple[ServiceProcess, Path]) -> None:
    address = supervisor[0].address
    async with CampaignsClient.connect(address, api_key=KEYS[ApiRole.RESEARCHER]) as campaigns:
        error = await expect_error(campaigns.start_campaign(campaign_spec()), grpc.StatusCode.PERMISSION_DENIED)
    assert error_reason(error) == "ROLE_NOT_PERMITTED"
    assert error.details() == "rob (roles: researcher) may not call StartCampaign; it is for: operator"
    async with RunsClient.connect(address, api_key=KEYS[ApiRole.READER]) as runs:
        error = await expect_error(runs.start_run("May I?"), grpc.StatusCode.PERMISSION_DENIED)
        assert error_reason(error) == "ROLE_NOT_PERMITTED" and "it is for: researcher" in (error.details() or "")
        await runs.list_runs()  # reading is every role's
    async with RunsClient.connect(address, api_key=KEYS[ApiRole.RESEARCHER]) as runs:
        run = await runs.start_run("Who asks?", request_id="who-asks")
        assert run.created_by == "rob"
    async with RunsClient.connect(address, api_key=KEYS[ApiRole.APPROVER]) as runs:
        assert (await runs.get_run(run.run_id)).created_by == "rob"
        await expect_error(runs.cancel_run(run.run_id), grpc.StatusCode.PERMISSION_DENIED)
    async with CampaignsClient.connect(address, api_key=KEYS[ApiRole.OPERATOR]) as campaigns:
        # Past the guard: the operator's campaign reaches the preflight, which finds no monitor there.
        error = await expect_error(
            campaigns.start_campaign(campaign_spec(), request_id="ops-start"), grpc.StatusCode.UNAVAILABLE
        )
    assert "does not answer, so no campaign can run" in (error.details() or "")


async def test_a_stored_key_works_at_once_and_is_refused_once_revoked(supervisor: tuple[ServiceProcess, Path]) -> None:
    service, data_dir = supervisor
    env = {**os.environ, "QUARRY_DATA_DIR": str(data_dir)}
    quarry = [sys.executable, "-m", "quarry", "keys"]
    added = await asyncio.to_thread(
        subprocess.run,
        [*quarry, "add", "carol-laptop", "--role", "researcher", "--principal", "carol"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    key = added.stdout.strip()
    assert key.startswith("qk_")
    async with RunsClient.connect(service.address, api_key=key) as runs:
        assert (await runs.start_run("Fresh key?")).created_by == "carol"  # no wait: an unknown key reloads
        revoke = [*quarry, "revoke", "carol-laptop"]
        await asyncio.to_thread(subprocess.run, revoke, env=env, capture_output=True, timeout=60, check=True)
        for _ in range(100):  # the supervisor re-reads its keys every 0.2 s here
            try:
                await runs.list_runs()
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the revoked key is still accepted")


def test_an_open_api_is_refused_while_campaigns_can_run_code(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "QUARRY_DATA_DIR": str(tmp_path),
        "QUARRY_SUPERVISOR_OPEN_API": "true",
        "QUARRY_SUPERVISOR_MONITOR_ADDRESS": f"127.0.0.1:{reusable_port()}",
    }
    served = subprocess.run(
        [sys.executable, "-m", "quarry", "serve", "supervisor", "--address", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 2
    assert "QUARRY_SUPERVISOR_OPEN_API is refused while campaigns can run code" in served.stderr, served.stderr


async def test_an_open_api_serves_anyone_as_anonymous_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    settings = SupervisorSettings(
        address="127.0.0.1:0",
        open_api=True,
        worker_addresses=f"127.0.0.1:{reusable_port()}",
        scratchpad_address=f"127.0.0.1:{reusable_port()}",
    )
    host = await build_supervisor(settings, QuarrySettings(data_dir=tmp_path))
    async with host, RunsClient.connect(host.address, api_key="") as runs:
        assert (await runs.start_run("Anyone?")).created_by == "anonymous"
    assert any("the public API is open" in record.getMessage() for record in caplog.records)
