"""DiagnosticsService: every server answers it, to anyone, with what the service works with and what it
finds checking from where it runs; never a secret, and never a way to flood what it depends on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import text_format
from sqlalchemy.engine import make_url

from monitor_svc.service import build_host as build_monitor
from quarry.clients.channels import open_channel
from quarry.config import (
    MonitorSettings,
    QuarrySettings,
    ScratchpadSettings,
    SupervisorSettings,
    WorkerSettings,
)
from quarry.diagnostics import Check, Diagnoser, Diagnostics, Finding, Status, model_diagnostics
from quarry.identity import MeshRole
from quarry.mesh_auth import MeshKeys
from quarry.v1 import diagnostics_pb2, diagnostics_pb2_grpc, supervisor_pb2, supervisor_pb2_grpc, worker_pb2
from quarry.v1 import worker_pb2_grpc as worker_grpc
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.service import build_host as build_supervisor
from tests.conftest import postgres_schema, reusable_port
from tests.fakes.openai_server import ScriptedModel
from worker_svc.service import build_host as build_worker

SECRETS = {
    "model API key": "sk-model-key-0f9a2c",
    "search API key": "tvly-search-key-77c1e0",
    "password in the model URL": "url-password-31d2aa",
    "database password": "db-password-5b0e41",
    "supervisor API token": "api-token-a8e4f7",
}

Responses = dict[str, diagnostics_pb2.GetDiagnosticsResponse]


async def diagnostics_of(address: str) -> diagnostics_pb2.GetDiagnosticsResponse:
    """What the service at `address` reports, asked with no credential at all."""
    async with open_channel(address) as channel:
        return await diagnostics_pb2_grpc.DiagnosticsServiceStub(channel).GetDiagnostics(
            diagnostics_pb2.GetDiagnosticsRequest(), timeout=10
        )


def facts(response: diagnostics_pb2.GetDiagnosticsResponse) -> dict[str, tuple[str, str]]:
    """Each fact's (value, setting), by name."""
    return {fact.name: (fact.value, fact.setting) for fact in response.facts}


def checks(response: diagnostics_pb2.GetDiagnosticsResponse) -> dict[str, diagnostics_pb2.DiagnosticCheck]:
    return {check.name: check for check in response.checks}


@dataclass
class SecretMesh:
    addresses: dict[str, str]
    mesh_tokens: list[str]


@contextlib.asynccontextmanager
async def mesh_with_secrets(tmp_path: Path, model: ScriptedModel) -> AsyncIterator[SecretMesh]:
    """Every service, authenticated as deployed, with a secret in every place one can be configured."""
    keys = MeshKeys.generate()
    url = make_url(model.base_url).set(username="quarry", password=SECRETS["password in the model URL"])
    shared = {
        "data_dir": tmp_path,
        "shutdown_grace_seconds": 1,
        "mesh_peers": keys.peers().render(),
        "mesh_insecure": False,
        "model_base_url": url.render_as_string(hide_password=False),
        "model_name": "scripted",
        "model_api_key": SECRETS["model API key"],
    }
    common = QuarrySettings(**shared)
    as_worker = QuarrySettings(**shared, mesh_token=keys.tokens[MeshRole.WORKER])
    as_supervisor = QuarrySettings(**shared, mesh_token=keys.tokens[MeshRole.SUPERVISOR])
    with postgres_schema() as schema:
        # The test server trusts local connections, so a password it never asks for is accepted.
        database = make_url(schema.url).set(password=SECRETS["database password"]).render_as_string(hide_password=False)
        async with contextlib.AsyncExitStack() as stack:
            scratchpad = await stack.enter_async_context(
                await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0", database_url=database), common)
            )
            worker = await stack.enter_async_context(
                await build_worker(
                    WorkerSettings(
                        address="127.0.0.1:0",
                        database_url=f"sqlite:///{tmp_path / 'worker.db'}",
                        scratchpad_address=scratchpad.address,
                        search_backend="tavily",
                        search_api_key=SECRETS["search API key"],
                    ),
                    as_worker,
                )
            )
            supervisor = await stack.enter_async_context(
                await build_supervisor(
                    SupervisorSettings(
                        address="127.0.0.1:0",
                        database_url=f"sqlite:///{tmp_path / 'supervisor.db'}",
                        scratchpad_address=scratchpad.address,
                        worker_addresses=worker.address,
                        auth_token=SECRETS["supervisor API token"],
                    ),
                    as_supervisor,
                )
            )
            monitor = await stack.enter_async_context(
                await build_monitor(MonitorSettings(address="127.0.0.1:0", jobs_dir=str(tmp_path / "jobs")), common)
            )
            yield SecretMesh(
                {
                    "scratchpad": scratchpad.address,
                    "worker": worker.address,
                    "supervisor": supervisor.address,
                    "monitor": monitor.address,
                },
                list(keys.tokens.values()),
            )


async def test_every_service_answers_anyone_and_reveals_no_secret(tmp_path: Path, model: ScriptedModel) -> None:
    async with mesh_with_secrets(tmp_path, model) as mesh:
        responses = {name: await diagnostics_of(address) for name, address in mesh.addresses.items()}
        # The services' own RPCs still want their credentials.
        async with open_channel(mesh.addresses["worker"]) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await worker_grpc.WorkerServiceStub(channel).GetDelegation(
                    worker_pb2.GetDelegationRequest(delegation_id="d-1"), timeout=10
                )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with open_channel(mesh.addresses["supervisor"]) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await supervisor_pb2_grpc.SupervisorServiceStub(channel).ListRuns(
                    supervisor_pb2.ListRunsRequest(), timeout=10
                )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert {name: response.service for name, response in responses.items()} == {name: name for name in responses}
    worker, scratchpad = responses["worker"], responses["scratchpad"]
    assert {fact.name: fact.value for fact in worker.facts}["model base URL"] == model.base_url
    # Each check used what holds a secret (the key, the URL's password, the database's) and succeeded.
    assert checks(worker)["model endpoint"].status == diagnostics_pb2.DIAGNOSTIC_STATUS_OK
    # Its supervisor tier falls back to the same endpoint, model and key: named, and checked once.
    assert "model endpoint (supervisor tier)" not in checks(worker)
    assert facts(worker)["model (supervisor tier)"] == (
        "the worker tier's endpoint and model: the model endpoint check covers both",
        "QUARRY_SUPERVISOR_MODEL_*",
    )
    assert checks(worker)["search (tavily)"].status == diagnostics_pb2.DIAGNOSTIC_STATUS_WARNING  # not called
    assert checks(scratchpad)["database"].status == diagnostics_pb2.DIAGNOSTIC_STATUS_OK
    assert {fact.name: fact.value for fact in scratchpad.facts}["database"].startswith("postgresql (127.0.0.1:5432/")
    secrets = [*SECRETS.values(), *mesh.mesh_tokens]
    for name, response in responses.items():
        for text in (response.SerializeToString(), text_format.MessageToString(response).encode()):
            assert [secret for secret in secrets if secret.encode() in text] == [], name
    assert model.requests == []  # no completion: the model list answers whether the model is served


async def test_a_service_reports_a_model_it_cannot_use_and_the_setting_to_change(model: ScriptedModel) -> None:
    closed = f"http://127.0.0.1:{reusable_port()}/v1"
    root = model.base_url.removesuffix("/v1")
    findings = {}
    cases = [(model.base_url, "scripted"), (model.base_url, "no-such-model"), (closed, "scripted"), (root, "scripted")]
    for base_url, name in cases:
        _, check = model_diagnostics(
            WorkerSettings(model_base_url=base_url, model_name=name), QuarrySettings(model_base_url="http://unused")
        )
        findings[base_url, name] = await check.run()
    assert findings[model.base_url, "scripted"] == Finding(Status.OK, f"{model.base_url} serves 'scripted'")
    unknown = findings[model.base_url, "no-such-model"]
    assert (unknown.status, unknown.setting) == (Status.FAILED, "QUARRY_WORKER_MODEL_NAME or QUARRY_MODEL_NAME")
    assert unknown.detail == f"'no-such-model' is not served at {model.base_url}; it serves: scripted"
    unreachable = findings[closed, "scripted"]
    assert unreachable.status == Status.FAILED and unreachable.detail.startswith(f"{closed} is not reachable: ")
    assert unreachable.setting == "QUARRY_WORKER_MODEL_BASE_URL or QUARRY_MODEL_BASE_URL"
    # The usual slip: the server's address without /v1. An error, with what was meant.
    without_v1 = findings[root, "scripted"]
    assert without_v1.status == Status.FAILED and without_v1.setting == unreachable.setting
    assert without_v1.detail == f"{root} has no /models (HTTP 404): did you mean {root}/v1?"
    assert model.requests == []


async def test_the_worker_checks_the_supervisor_tier_model_as_it_resolves_it(
    tmp_path: Path, model: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1, model_base_url=model.base_url)
    responses = {}
    async with (
        ScriptedModel() as other,
        await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common) as scratchpad,
    ):
        settings = WorkerSettings(address="127.0.0.1:0", scratchpad_address=scratchpad.address, model_name="scripted")
        # Its own endpoint; the model name is the worker tier's, which it leaves unset.
        own = SupervisorSettings(model_base_url=other.base_url)
        async with await build_worker(settings, common, supervisor_tier=own) as worker:
            responses["own endpoint"] = await diagnostics_of(worker.address)
        # A model the endpoint does not serve, named where the worker runs.
        monkeypatch.setenv("QUARRY_SUPERVISOR_MODEL_NAME", "no-such-model")
        async with await build_worker(settings, common) as worker:
            responses["unserved model"] = await diagnostics_of(worker.address)
    served = responses["own endpoint"]
    assert facts(served)["model base URL (supervisor tier)"] == (
        other.base_url,
        "QUARRY_SUPERVISOR_MODEL_BASE_URL, QUARRY_WORKER_MODEL_BASE_URL or QUARRY_MODEL_BASE_URL",
    )
    assert facts(served)["model name (supervisor tier)"][0] == "scripted"
    assert facts(served)["model base URL"][0] == model.base_url
    found = {check.name: (check.status, check.detail) for check in served.checks}
    assert found["model endpoint"] == (diagnostics_pb2.DIAGNOSTIC_STATUS_OK, f"{model.base_url} serves 'scripted'")
    assert found["model endpoint (supervisor tier)"] == (
        diagnostics_pb2.DIAGNOSTIC_STATUS_OK,
        f"{other.base_url} serves 'scripted'",
    )
    unserved = checks(responses["unserved model"])
    assert unserved["model endpoint"].status == diagnostics_pb2.DIAGNOSTIC_STATUS_OK
    refused = unserved["model endpoint (supervisor tier)"]
    assert (refused.status, refused.setting) == (
        diagnostics_pb2.DIAGNOSTIC_STATUS_FAILED,
        "QUARRY_SUPERVISOR_MODEL_NAME, QUARRY_WORKER_MODEL_NAME or QUARRY_MODEL_NAME",
    )
    assert refused.detail == f"'no-such-model' is not served at {model.base_url}; it serves: scripted"
    assert model.requests == other.requests == []


async def test_the_supervisor_checks_the_services_it_calls(tmp_path: Path, model: ScriptedModel) -> None:
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1, model_base_url=model.base_url)
    missing = f"127.0.0.1:{reusable_port()}"
    async with (
        await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common) as scratchpad,
        await build_supervisor(
            SupervisorSettings(
                address="127.0.0.1:0",
                scratchpad_address=scratchpad.address,
                worker_addresses=missing,
                model_name="scripted",
            ),
            common,
        ) as supervisor,
    ):
        response = await diagnostics_of(supervisor.address)
    found = {check.name: (check.status, check.setting) for check in response.checks}
    assert found == {
        "model endpoint": (diagnostics_pb2.DIAGNOSTIC_STATUS_OK, ""),
        "scratchpad": (diagnostics_pb2.DIAGNOSTIC_STATUS_OK, ""),
        "worker": (diagnostics_pb2.DIAGNOSTIC_STATUS_FAILED, "QUARRY_SUPERVISOR_WORKER_ADDRESSES"),
        "database": (diagnostics_pb2.DIAGNOSTIC_STATUS_OK, ""),
    }
    assert checks(response)["worker"].detail.startswith(f"UNAVAILABLE at {missing}")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_checks_run_at_most_once_per_interval_and_never_twice_at_once() -> None:
    clock, runs = Clock(), []

    async def count() -> Finding:
        runs.append(clock.now)
        return Finding(Status.OK, f"run {len(runs)}")

    diagnoser = Diagnoser(Diagnostics("probe", checks=[Check("count", count)]), reuse_seconds=5, clock=clock)
    reports = await asyncio.gather(*(diagnoser.report() for _ in range(5)))
    assert runs == [0.0] and all(report is reports[0] for report in reports)
    clock.now = 4.9
    assert (await diagnoser.report()).findings == (("count", Finding(Status.OK, "run 1")),)
    clock.now = 5.0
    assert (await diagnoser.report()).findings == (("count", Finding(Status.OK, "run 2")),)
    assert runs == [0.0, 5.0]


async def test_a_check_that_overruns_is_reported_and_waited_on_rather_than_started_again() -> None:
    clock, started, release = Clock(), [], asyncio.Event()

    async def slow() -> Finding:
        started.append(clock.now)
        await release.wait()
        return Finding(Status.OK, "answered at last")

    diagnoser = Diagnoser(
        Diagnostics("probe", checks=[Check("slow", slow)]), check_seconds=0.05, reuse_seconds=5, clock=clock
    )
    overran = ("slow", Finding(Status.FAILED, "no answer within 0.05 s"))
    assert (await diagnoser.report()).findings == (overran,)
    clock.now = 10.0
    assert (await diagnoser.report()).findings == (overran,)
    assert started == [0.0]
    release.set()
    clock.now = 20.0
    assert (await diagnoser.report()).findings == (("slow", Finding(Status.OK, "answered at last")),)


async def test_a_check_that_raises_is_a_failed_check_without_its_message() -> None:
    async def broken() -> Finding:
        raise RuntimeError(f"could not log in with {SECRETS['model API key']}")

    report = await Diagnoser(Diagnostics("probe", checks=[Check("broken", broken)])).report()
    assert report.findings == (
        ("broken", Finding(Status.FAILED, "the check itself failed (RuntimeError); see the service's log")),
    )
