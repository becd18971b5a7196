"""WorkerService requests refused before anything runs: each bad field named, nothing sent to the model."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from google.protobuf import duration_pb2

from quarry.v1 import common_pb2, worker_pb2
from tests.fakes.openai_server import ScriptedModel
from tests.fakes.web_server import FixtureWeb
from tests.rpc import expect_error, violations
from tests.worker_svc.test_delegate import Mesh, in_process, mesh_on


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker_on_database(
    tmp_path_factory: pytest.TempPathFactory,
    shared_model: ScriptedModel,
    shared_site: FixtureWeb,
    module_database_url: str,
) -> AsyncIterator[Mesh]:
    """The worker in this process, its delegations in SQLite or PostgreSQL (each test runs on both). The tests
    that use it send only requests it refuses, so they share it."""
    directory = tmp_path_factory.mktemp("worker")
    services = in_process(directory, shared_model, shared_site, True, module_database_url)
    async with mesh_on(services, shared_model, shared_site) as mesh:
        yield mesh


@pytest.fixture
def mesh_on_database(worker_on_database: Mesh) -> Mesh:
    worker_on_database.model.forget()
    return worker_on_database


LONG = "x" * 2049
BAD_REQUESTS: list[tuple[str, dict[str, object], str]] = [
    ("no delegation_id", {"delegation_id": ""}, "delegation_id"),
    ("run_id with a space", {"run_id": "has space"}, "run_id"),
    ("malformed thread", {"scratchpad_thread_id": "Not-A-Thread"}, "scratchpad_thread_id"),
    ("blank objective", {"task": worker_pb2.ResearchTask(objective="  ")}, "task.objective"),
    ("supervisor role", {"role": common_pb2.ROLE_SUPERVISOR}, "role"),
    # A tier a newer client knows is refused, not run at the role's default tier.
    ("a tier this server does not know", {"tier": 7}, "tier"),
    ("too many turns", {"budget": worker_pb2.DelegationBudget(max_turns=1000)}, "budget.max_turns"),
    (
        "timeout beyond a day",
        {"budget": worker_pb2.DelegationBudget(timeout=duration_pb2.Duration(seconds=315_576_000_000))},
        "budget.timeout",
    ),
    ("NUL in delegation_id", {"delegation_id": "run-1:\x00"}, "delegation_id"),
    ("NUL in run_id", {"run_id": "run\x00"}, "run_id"),
    ("NUL in tool_call_id", {"tool_call_id": "call\x00"}, "tool_call_id"),
    ("NUL in the objective", {"task": worker_pb2.ResearchTask(objective="Find\x00 it")}, "task.objective"),
    (
        "NUL in a criterion",
        {"task": worker_pb2.ResearchTask(objective="Find it", criteria=["ok", "cite\x00"])},
        "task.criteria[1]",
    ),
    (
        "NUL in an input ref",
        {"task": worker_pb2.ResearchTask(objective="Find it", input_refs=["https://a.b/\x00"])},
        "task.input_refs[0]",
    ),
    ("too many criteria", {"task": worker_pb2.ResearchTask(objective="Find it", criteria=["c"] * 11)}, "task.criteria"),
    (
        "too many input refs",
        {"task": worker_pb2.ResearchTask(objective="Find it", input_refs=["r"] * 21)},
        "task.input_refs",
    ),
    (
        "a long criterion",
        {"task": worker_pb2.ResearchTask(objective="Find it", criteria=[LONG])},
        "task.criteria[0]",
    ),
    (
        "a long input ref",
        {"task": worker_pb2.ResearchTask(objective="Find it", input_refs=["ok", LONG])},
        "task.input_refs[1]",
    ),
    (
        "megabytes of criteria",
        {"task": worker_pb2.ResearchTask(objective="Find it", criteria=["c" * (1 << 20)] * 3)},
        "task.criteria[2]",
    ),
    ("a long objective", {"task": worker_pb2.ResearchTask(objective="o" * 16_001)}, "task.objective"),
    ("NUL in the question", {"task": worker_pb2.ResearchTask(objective="Find it", question="q\x00")}, "task.question"),
    # A blind role sees only its inputs: a task naming no scratchpad entry gives it nothing to judge.
    (
        "a verifier with no entry to judge",
        {
            "role": common_pb2.ROLE_VERIFIER,
            "task": worker_pb2.ResearchTask(objective="Verify", input_refs=["https://a.b/"]),
        },
        "task.input_refs",
    ),
]


@pytest.mark.parametrize(("case", "change", "field"), BAD_REQUESTS, ids=[case[0] for case in BAD_REQUESTS])
@pytest.mark.asyncio(loop_scope="module")
async def test_bad_requests_are_invalid_argument(
    mesh_on_database: Mesh, case: str, change: dict[str, object], field: str
) -> None:
    mesh = mesh_on_database
    request = mesh.request()
    for name, value in change.items():
        if isinstance(value, worker_pb2.ResearchTask | worker_pb2.DelegationBudget):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)
    error = await expect_error(mesh.delegate(request), grpc.StatusCode.INVALID_ARGUMENT)
    assert field in violations(error), violations(error)
    assert mesh.model.requests == [], "nothing reached the model"


@pytest.mark.parametrize("delegation_id", ["", "run-1:\x00", "has space", "d" * 257])
@pytest.mark.asyncio(loop_scope="module")
async def test_get_delegation_refuses_a_malformed_id(mesh_on_database: Mesh, delegation_id: str) -> None:
    request = worker_pb2.GetDelegationRequest(delegation_id=delegation_id)
    error = await expect_error(mesh_on_database.worker.GetDelegation(request), grpc.StatusCode.INVALID_ARGUMENT)
    assert "delegation_id" in violations(error)
