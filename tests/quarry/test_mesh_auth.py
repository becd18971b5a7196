"""Authentication between the services: authority comes from the caller's proven mesh role, never from
what a request claims (every internal service, over real gRPC, with the mesh's own tokens)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from monitor_svc.service import ACCESS as MONITOR_ACCESS
from monitor_svc.service import build_host as build_monitor
from quarry.cli import main
from quarry.clients.channels import open_channel
from quarry.config import ConfigurationError, MonitorSettings, QuarrySettings, ScratchpadSettings
from quarry.errors import ErrorReason
from quarry.identity import MeshRole
from quarry.mesh_auth import MeshPeers, new_token, token_digest
from quarry.records.research import Adjudication, AdjudicationDecision
from quarry.v1 import common_pb2, monitor_pb2, monitor_pb2_grpc, scratchpad_pb2, scratchpad_pb2_grpc, worker_pb2
from quarry.v1 import worker_pb2_grpc as worker_grpc
from scratchpad_svc.service import ACCESS as SCRATCHPAD_ACCESS
from scratchpad_svc.service import build_host as build_scratchpad
from tests.quarry.every_service import MONITOR, SCRATCHPAD, WORKER, Services, every_service
from tests.rpc import error_reason
from worker_svc.service import ACCESS as WORKER_ACCESS

SOURCE = common_pb2.Source(url="https://example.org/a", title="A", excerpt="quoted")


@pytest.fixture
async def services(tmp_path: Path) -> AsyncIterator[Services]:
    async with every_service(tmp_path) as services:
        yield services


def _append(
    thread_id: str, kind: int, role: int, content: str = "a claim", **extra: object
) -> scratchpad_pb2.AppendRequest:
    return scratchpad_pb2.AppendRequest(
        thread_id=thread_id,
        request_id=new_token()[:16],
        kind=kind,  # type: ignore[arg-type]
        author=common_pb2.Principal(principal_id="someone", role=role),  # type: ignore[arg-type]
        content=content,
        **extra,  # type: ignore[arg-type]
    )


async def _thread(services: Services) -> str:
    async with open_channel(services.addresses[SCRATCHPAD], token=services.mesh_tokens[MeshRole.SUPERVISOR]) as ch:
        response = await scratchpad_pb2_grpc.ScratchpadServiceStub(ch).CreateThread(
            scratchpad_pb2.CreateThreadRequest(title="mesh"), timeout=10
        )
    return response.thread.thread_id


async def _code(call: object) -> tuple[grpc.StatusCode, str]:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as error:
        return error.code(), error_reason(error)
    return grpc.StatusCode.OK, ""


async def test_an_unauthenticated_caller_cannot_write_read_delegate_or_watch_gpus(services: Services) -> None:
    thread_id = await _thread(services)
    for token in ["", "not-a-mesh-token"]:
        async with (
            open_channel(services.addresses[SCRATCHPAD], token=token) as scratchpad,
            open_channel(services.addresses[WORKER], token=token) as worker,
            open_channel(services.addresses[MONITOR], token=token) as monitor,
        ):
            stub = scratchpad_pb2_grpc.ScratchpadServiceStub(scratchpad)
            forged = _append(thread_id, scratchpad_pb2.ENTRY_KIND_SEED, common_pb2.ROLE_SUPERVISOR)
            read = scratchpad_pb2.ReadRequest(thread_id=thread_id)
            delegate = worker_pb2.DelegateRequest(delegation_id="d-1", run_id="r", tool_call_id="c")
            answers = [
                await _code(stub.Append(forged, timeout=10)),
                await _code(stub.Read(read, timeout=10)),
                await _code(
                    worker_grpc.WorkerServiceStub(worker).GetDelegation(
                        worker_pb2.GetDelegationRequest(delegation_id="d-1"), timeout=10
                    )
                ),
                await _code(
                    monitor_pb2_grpc.MonitorServiceStub(monitor).ListGpus(monitor_pb2.ListGpusRequest(), timeout=10)
                ),
            ]
            stream = worker_grpc.WorkerServiceStub(worker).Delegate(delegate, timeout=10)
            answers.append(await _code(stream.read()))
        refused = (grpc.StatusCode.UNAUTHENTICATED, ErrorReason.MESH_CREDENTIAL_INVALID)
        assert answers == [refused] * 5, token
    # Nothing reached the thread, and no delegation spent a model call.
    async with open_channel(services.addresses[SCRATCHPAD], token=services.mesh_tokens[MeshRole.WORKER]) as channel:
        page = await scratchpad_pb2_grpc.ScratchpadServiceStub(channel).Read(
            scratchpad_pb2.ReadRequest(thread_id=thread_id), timeout=10
        )
    assert list(page.entries) == []
    assert services.model.requests == []


async def test_the_author_role_a_request_claims_must_be_one_its_caller_holds(services: Services) -> None:
    thread_id = await _thread(services)
    finding: dict[str, object] = {"sources": [SOURCE]}
    decided = {
        "content": Adjudication(
            objection_ref=1, decision=AdjudicationDecision.APPROVE, rationale="ok"
        ).model_dump_json()
    }
    cases = [
        # (caller, kind, claimed role) -> the answer
        (MeshRole.WORKER, scratchpad_pb2.ENTRY_KIND_SEED, common_pb2.ROLE_SUPERVISOR, {}),
        (MeshRole.WORKER, scratchpad_pb2.ENTRY_KIND_NOTE, common_pb2.ROLE_SUPERVISOR, {}),
        (MeshRole.SUPERVISOR, scratchpad_pb2.ENTRY_KIND_FINDING, common_pb2.ROLE_RESEARCHER, finding),
        (MeshRole.SUPERVISOR, scratchpad_pb2.ENTRY_KIND_VERDICT, common_pb2.ROLE_VERIFIER, {}),
        # The supervisor cannot decide objections to its own report; a worker runs the adjudicator.
        (MeshRole.SUPERVISOR, scratchpad_pb2.ENTRY_KIND_ADJUDICATION, common_pb2.ROLE_ADJUDICATOR, decided),
        (MeshRole.WORKER, scratchpad_pb2.ENTRY_KIND_FINDING, common_pb2.ROLE_RESEARCHER, finding),
        (MeshRole.SUPERVISOR, scratchpad_pb2.ENTRY_KIND_NOTE, common_pb2.ROLE_SUPERVISOR, {}),
        (MeshRole.SUPERVISOR, scratchpad_pb2.ENTRY_KIND_NOTE, common_pb2.ROLE_ENGINEER, {}),
        (MeshRole.WORKER, scratchpad_pb2.ENTRY_KIND_NOTE, common_pb2.ROLE_ENGINEER, {}),
        (MeshRole.WORKER, scratchpad_pb2.ENTRY_KIND_VERDICT, common_pb2.ROLE_VERIFIER, {}),
    ]
    answers = []
    for caller, kind, role, extra in cases:
        async with open_channel(services.addresses[SCRATCHPAD], token=services.mesh_tokens[caller]) as channel:
            stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
            answers.append(await _code(stub.Append(_append(thread_id, kind, role, **extra), timeout=10)))
    denied = (grpc.StatusCode.PERMISSION_DENIED, ErrorReason.CALLER_NOT_PERMITTED)
    ok = (grpc.StatusCode.OK, "")
    assert answers == [denied] * 5 + [ok, ok, denied, ok, ok]


async def test_each_method_is_open_only_to_the_roles_its_service_names(services: Services) -> None:
    async with (
        open_channel(services.addresses[SCRATCHPAD], token=services.mesh_tokens[MeshRole.WORKER]) as scratchpad,
        open_channel(services.addresses[WORKER], token=services.mesh_tokens[MeshRole.WORKER]) as worker,
        open_channel(services.addresses[MONITOR], token=services.mesh_tokens[MeshRole.WORKER]) as monitor,
    ):
        create = scratchpad_pb2_grpc.ScratchpadServiceStub(scratchpad).CreateThread(
            scratchpad_pb2.CreateThreadRequest(title="by a worker"), timeout=10
        )
        delegate = worker_grpc.WorkerServiceStub(worker).Delegate(
            worker_pb2.DelegateRequest(delegation_id="d-2", run_id="r", tool_call_id="c"), timeout=10
        )
        gpus = monitor_pb2_grpc.MonitorServiceStub(monitor).ListGpus(monitor_pb2.ListGpusRequest(), timeout=10)
        answers = [await _code(create), await _code(delegate.read()), await _code(gpus)]
    denied = (grpc.StatusCode.PERMISSION_DENIED, ErrorReason.CALLER_NOT_PERMITTED)
    assert answers == [denied, denied, (grpc.StatusCode.OK, "")]
    assert services.model.requests == []


async def test_health_and_reflection_stay_open(services: Services) -> None:
    for address in services.addresses.values():
        async with grpc.aio.insecure_channel(address) as channel:
            response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_every_rpc_of_an_internal_service_says_who_may_call_it() -> None:
    descriptors = {
        "ScratchpadService": (scratchpad_pb2, SCRATCHPAD_ACCESS),
        "WorkerService": (worker_pb2, WORKER_ACCESS),
        "MonitorService": (monitor_pb2, MONITOR_ACCESS),
    }
    for name, (module, access) in descriptors.items():
        methods = {method.name for method in module.DESCRIPTOR.services_by_name[name].methods}
        assert set(access) == methods, name
        assert all(roles for roles in access.values()), name


async def test_job_submission_is_refused_unless_the_monitor_allows_it(tmp_path: Path) -> None:
    token = new_token()
    common = QuarrySettings(
        data_dir=tmp_path, mesh_peers=MeshPeers.of_tokens([(MeshRole.WORKER, token)]).render(), mesh_insecure=False
    )
    marker = tmp_path / "ran"
    request = monitor_pb2.SubmitJobRequest(
        request_id="job-1",
        local=monitor_pb2.LocalCommand(argv=["/bin/sh", "-c", f"touch {marker}"], working_directory=str(tmp_path)),
    )
    async with (
        await build_monitor(MonitorSettings(address="127.0.0.1:0"), common) as host,
        open_channel(host.address, token=token) as channel,
    ):
        answer = await _code(monitor_pb2_grpc.MonitorServiceStub(channel).SubmitJob(request, timeout=10))
    assert answer == (grpc.StatusCode.PERMISSION_DENIED, ErrorReason.JOB_SUBMISSION_DISABLED)
    assert not marker.exists()


async def test_an_internal_service_without_peers_refuses_to_start_unless_told_it_may_run_open(
    tmp_path: Path,
) -> None:
    settings = ScratchpadSettings(address="127.0.0.1:0", database_url=f"sqlite:///{tmp_path / 'pad.db'}")
    with pytest.raises(ConfigurationError, match="QUARRY_MESH_PEERS"):
        await build_scratchpad(settings, QuarrySettings(data_dir=tmp_path, mesh_insecure=False))
    async with await build_scratchpad(settings, QuarrySettings(data_dir=tmp_path, mesh_insecure=True)) as host:
        assert host.port > 0


def test_peers_parse_render_and_identify() -> None:
    supervisor, worker, old_worker = new_token(), new_token(), new_token()
    text = f"supervisor={token_digest(supervisor)}, worker={token_digest(worker)},worker={token_digest(old_worker)}"
    peers = MeshPeers.parse(text)
    assert MeshPeers.parse(peers.render()) == peers
    assert peers.identify(supervisor) == MeshRole.SUPERVISOR
    # Two worker tokens at once: a rotation in progress.
    assert peers.identify(worker) == peers.identify(old_worker) == MeshRole.WORKER
    assert peers.identify("") is None
    assert peers.identify(token_digest(worker)) is None  # the digest itself is no credential
    assert MeshPeers.parse("worker=cn:quarry-worker").identify("", ["quarry-worker"]) == MeshRole.WORKER


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("root=sha256:" + "0" * 64, "unknown role 'root'"),
        ("worker", "is not ROLE=sha256:HEX"),
        ("worker=sha256:abc", "64 hex digits"),
        ("worker=" + "0" * 64, "64 hex digits"),
        ("worker=sha256:" + "z" * 64, "not hexadecimal"),
    ],
)
def test_bad_peers_are_a_configuration_error_naming_the_setting(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match="QUARRY_MESH_PEERS") as raised:
        MeshPeers.parse(text)
    assert message in str(raised.value)


def _blocks(output: str) -> dict[str, dict[str, str]]:
    blocks: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith("# ") and " " not in line[2:]:
            current = blocks.setdefault(line[2:], {})
        elif "=" in line and not line.startswith("#"):
            name, _, value = line.partition("=")
            current[name] = value
    return blocks


def test_mesh_keys_gives_each_service_only_its_own_token(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mesh", "keys"]) == 0
    blocks = _blocks(capsys.readouterr().out)
    assert set(blocks) == {"scratchpad", "monitor", "worker", "supervisor"}
    peers = MeshPeers.parse(blocks["scratchpad"]["QUARRY_MESH_PEERS"])
    assert all(MeshPeers.parse(block["QUARRY_MESH_PEERS"]) == peers for block in blocks.values())
    assert "QUARRY_MESH_TOKEN" not in blocks["scratchpad"] and "QUARRY_MESH_TOKEN" not in blocks["monitor"]
    assert peers.identify(blocks["worker"]["QUARRY_MESH_TOKEN"]) == MeshRole.WORKER
    assert peers.identify(blocks["supervisor"]["QUARRY_MESH_TOKEN"]) == MeshRole.SUPERVISOR


def test_mesh_keys_for_kubernetes_is_the_secret_the_manifests_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mesh", "keys", "--format", "kubernetes"]) == 0
    secret = yaml.safe_load(capsys.readouterr().out)
    assert (secret["kind"], secret["metadata"]["name"]) == ("Secret", "quarry-mesh")
    data = secret["stringData"]
    peers = MeshPeers.parse(data["peers"])
    assert peers.identify(data["worker-token"]) == MeshRole.WORKER
    assert peers.identify(data["supervisor-token"]) == MeshRole.SUPERVISOR
