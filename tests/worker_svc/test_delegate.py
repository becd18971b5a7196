"""WorkerService.Delegate over real gRPC: one correlated result, honest failures, bounds."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import QuarrySettings, ScratchpadSettings, WorkerSettings
from quarry.v1 import common_pb2, scratchpad_pb2, worker_pb2, worker_pb2_grpc
from scratchpad_svc.service import build_host as build_scratchpad
from tests.conftest import ServiceProcess, start_service, stop_service
from tests.fakes.openai_server import Call, DropAfter, Reply, ScriptedModel, Stall
from tests.fakes.web_server import FixtureWeb
from worker_svc.service import build_host as build_worker
from worker_svc.service import default_worker_id


@dataclass
class Mesh:
    model: ScriptedModel
    site: FixtureWeb
    worker: worker_pb2_grpc.WorkerServiceStub
    scratchpad: ScratchpadClient
    thread_id: str
    # Begins the worker's graceful shutdown (SIGTERM for a process).
    stop_worker: Callable[[], Awaitable[None]]
    health: health_pb2_grpc.HealthStub

    def request(self, delegation_id: str = "run-1:call-1", **budget: object) -> worker_pb2.DelegateRequest:
        return worker_pb2.DelegateRequest(
            delegation_id=delegation_id,
            run_id="run-1",
            tool_call_id=delegation_id.split(":")[-1],
            scratchpad_thread_id=self.thread_id,
            task=worker_pb2.ResearchTask(objective="Find the height of the Eiffel Tower.", criteria=["cite a source"]),
            role=common_pb2.ROLE_RESEARCHER,
            budget=worker_pb2.DelegationBudget(**budget),  # type: ignore[arg-type]
        )

    async def delegate(self, request: worker_pb2.DelegateRequest) -> list[worker_pb2.DelegateResponse]:
        return [response async for response in self.worker.Delegate(request, timeout=60)]


WORKER_ID = "worker-7"
IN_PROCESS = ("in-process", True)
PROCESSES = pytest.param(("processes", True), marks=pytest.mark.slow, id="processes")
# The worker process the module's tests share, where a test neither stops the worker or the model nor sends
# another test's delegation ids; the others start their own (OWN_MESH). All share one scratchpad process.
SHARED_PROCESSES = pytest.param(("shared processes", True), marks=pytest.mark.slow, id="processes")
OWN_MESH = pytest.mark.parametrize("mesh", [IN_PROCESS, PROCESSES], ids=["in-process", "processes"], indirect=True)


def worker_settings(
    model: ScriptedModel, site: FixtureWeb, scratchpad_address: str, native_tools: bool
) -> dict[str, str]:
    """The worker's configuration, as the environment variables a deployment would set."""
    return {
        "QUARRY_WORKER_SCRATCHPAD_ADDRESS": scratchpad_address,
        "QUARRY_WORKER_MODEL_BASE_URL": model.base_url,
        "QUARRY_WORKER_MODEL_NAME": "scripted",
        "QUARRY_WORKER_MODEL_NATIVE_TOOLS": str(native_tools).lower(),
        "QUARRY_WORKER_SEARCH_BACKEND": "searxng",
        "QUARRY_WORKER_SEARXNG_URL": site.base_url,
        "QUARRY_WORKER_FETCH_ALLOW": f"127.0.0.1:{site.port}",
        "QUARRY_WORKER_MAX_CONCURRENT_DELEGATIONS": "2",
        "QUARRY_WORKER_ID": WORKER_ID,
    }


@asynccontextmanager
async def in_process(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, native_tools: bool, database_url: str = ""
) -> AsyncIterator[tuple[str, str, Callable[[], Awaitable[None]]]]:
    """Scratchpad and worker hosts in this process (fast; real gRPC over real sockets).

    The worker's database is `database_url`, or SQLite in the data directory.
    """
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=2)
    scratchpad_host = await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common)
    async with scratchpad_host:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in worker_settings(model, site, scratchpad_host.address, native_tools).items():
                patch.setenv(name, value)
            if database_url:
                patch.setenv("QUARRY_WORKER_DATABASE_URL", database_url)
            settings = WorkerSettings(address="127.0.0.1:0")
        async with await build_worker(settings, common) as worker_host:
            yield scratchpad_host.address, worker_host.address, worker_host.shutdown


def process_env(data_dir: Path) -> dict[str, str]:
    return {"QUARRY_DATA_DIR": str(data_dir), "QUARRY_LOG_LEVEL": "WARNING", "QUARRY_SHUTDOWN_GRACE_SECONDS": "2"}


def start_worker(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, native_tools: bool, scratchpad: ServiceProcess
) -> ServiceProcess:
    """The worker as its own OS process, configured through the environment."""
    env = {**process_env(tmp_path), **worker_settings(model, site, scratchpad.address, native_tools)}
    return start_service("worker", env, tmp_path)


@contextmanager
def stopped_cleanly(service: ServiceProcess) -> Iterator[None]:
    """Once the block ends, the service exits with status 0 on SIGTERM; it is stopped however the block ends."""
    try:
        yield
        assert stop_service(service) == 0, service.log()
    finally:
        stop_service(service)


@pytest.fixture(scope="module")
def scratchpad_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """The scratchpad as its own OS process, for every test whose worker is one (each test has its own thread)."""
    directory = tmp_path_factory.mktemp("scratchpad")
    scratchpad = start_service("scratchpad", process_env(directory), directory)
    with stopped_cleanly(scratchpad):
        yield scratchpad


@asynccontextmanager
async def processes(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, native_tools: bool, scratchpad: ServiceProcess
) -> AsyncIterator[tuple[str, str, Callable[[], Awaitable[None]]]]:
    worker = await asyncio.to_thread(start_worker, tmp_path, model, site, native_tools, scratchpad)
    with stopped_cleanly(worker):

        async def terminate_worker() -> None:
            worker.terminate()

        yield scratchpad.address, worker.address, terminate_worker


@pytest.fixture(scope="module")
def shared_worker(
    tmp_path_factory: pytest.TempPathFactory,
    shared_model: ScriptedModel,
    shared_site: FixtureWeb,
    scratchpad_process: ServiceProcess,
) -> Iterator[ServiceProcess]:
    worker = start_worker(tmp_path_factory.mktemp("worker"), shared_model, shared_site, True, scratchpad_process)
    with stopped_cleanly(worker):
        yield worker


@asynccontextmanager
async def shared(
    scratchpad: ServiceProcess, worker: ServiceProcess
) -> AsyncIterator[tuple[str, str, Callable[[], Awaitable[None]]]]:
    async def keep_running() -> None:
        raise AssertionError("a worker that other tests share is not one test's to stop (use OWN_MESH)")

    yield scratchpad.address, worker.address, keep_running


@pytest.fixture(params=[IN_PROCESS, SHARED_PROCESSES], ids=["in-process", "processes"])
async def mesh(
    tmp_path: Path, request: pytest.FixtureRequest, model: ScriptedModel, site: FixtureWeb
) -> AsyncIterator[Mesh]:
    mode, native_tools = request.param
    services: AbstractAsyncContextManager[tuple[str, str, Callable[[], Awaitable[None]]]]
    if mode == "in-process":
        services = in_process(tmp_path, model, site, native_tools)
    elif mode == "processes":
        services = processes(tmp_path, model, site, native_tools, request.getfixturevalue("scratchpad_process"))
    else:
        model, site = request.getfixturevalue("shared_model"), request.getfixturevalue("shared_site")
        model.forget()
        worker = request.getfixturevalue("shared_worker")
        services = shared(request.getfixturevalue("scratchpad_process"), worker)
    async with mesh_on(services, model, site) as mesh:
        yield mesh


@asynccontextmanager
async def mesh_on(
    services: AbstractAsyncContextManager[tuple[str, str, Callable[[], Awaitable[None]]]],
    model: ScriptedModel,
    site: FixtureWeb,
) -> AsyncIterator[Mesh]:
    async with (
        services as (scratchpad_address, worker_address, stop_worker),
        insecure_channel(worker_address) as worker_channel,
        insecure_channel(scratchpad_address) as scratchpad_channel,
    ):
        scratchpad = ScratchpadClient(scratchpad_channel)
        thread = await scratchpad.create_thread(title="eiffel")
        await scratchpad.append(
            thread.thread_id,
            kind=scratchpad_pb2.ENTRY_KIND_SEED,
            author=common_pb2.Principal(principal_id="supervisor", role=common_pb2.ROLE_SUPERVISOR),
            content="Find the height of the Eiffel Tower.",
        )
        stub = worker_pb2_grpc.WorkerServiceStub(worker_channel)
        yield Mesh(
            model, site, stub, scratchpad, thread.thread_id, stop_worker, health_pb2_grpc.HealthStub(worker_channel)
        )


def finding(url: str, excerpt: str = "The tower is 330 metres tall") -> dict[str, object]:
    return {
        "kind": "finding",
        "content": "The Eiffel Tower is 330 m tall.",
        "sources": [{"url": url, "title": "The Eiffel Tower", "excerpt": excerpt}],
    }


async def test_a_delegation_streams_progress_and_ends_in_one_result(mesh: Mesh) -> None:
    article = f"{mesh.site.base_url}/article.html"
    mesh.model.script(
        Reply(calls=(Call("read_scratchpad", {}, "a"), Call("perform_web_search", {"query": "eiffel tower"}, "b"))),
        Reply(calls=(Call("read_web_page", {"url": article}, "c"),)),
        Reply(calls=(Call("append_scratchpad", finding(article, "The tower is 300 metres tall"), "wrong"),)),
        Reply(calls=(Call("append_scratchpad", finding(article), "d"),)),
        Reply(content="Promoted entry 2: the tower is 330 m tall."),
    )
    events = await mesh.delegate(mesh.request())
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds[0] == "started" and kinds[-1] == "result" and kinds.count("result") == 1
    result = events[-1].result
    assert result.delegation_id == "run-1:call-1" and result.tool_call_id == "call-1"
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED
    assert result.summary == "Promoted entry 2: the tower is 330 m tall."
    assert list(result.promoted_sequence_nos) == [2]
    assert result.turns_used == 5 and result.usage.input_tokens == 50
    rejected = [m for m in mesh.model.requests[3]["messages"] if m.get("tool_call_id") == "wrong"]
    assert "does not occur" in rejected[0]["content"], "a misquote is refused, and the corrected append lands"
    conversation_id = events[0].started.conversation_id
    assert conversation_id and conversation_id != mesh.thread_id and result.conversation_id == conversation_id
    assert events[0].started.worker_id == result.worker_id == WORKER_ID, "the worker names itself as configured"
    progress = [e.progress for e in events if e.WhichOneof("event") == "progress"]
    assert [(p.turn, p.max_turns) for p in progress if p.kind == worker_pb2.PROGRESS_KIND_TURN_STARTED] == [
        (turn, 8) for turn in range(1, 6)
    ]
    assert [p.tool_name for p in progress if p.kind == worker_pb2.PROGRESS_KIND_TOOL_CALLED] == [
        "read_scratchpad",
        "perform_web_search",
        "read_web_page",
        "append_scratchpad",
        "append_scratchpad",
    ]
    assert [p.scratchpad_sequence_no for p in progress if p.kind == worker_pb2.PROGRESS_KIND_SCRATCHPAD_APPENDED] == [2]
    # The conversation stayed private: the scratchpad holds the seed and the finding only.
    entries = await mesh.scratchpad.read_all(mesh.thread_id)
    assert [e.kind for e in entries] == [scratchpad_pb2.ENTRY_KIND_SEED, scratchpad_pb2.ENTRY_KIND_FINDING]
    assert entries[1].author.principal_id == "run-1:call-1"

    recorded = (
        await mesh.worker.GetDelegation(worker_pb2.GetDelegationRequest(delegation_id="run-1:call-1"))
    ).delegation
    assert recorded.state == worker_pb2.DELEGATION_STATE_SUCCEEDED and recorded.result == result
    assert recorded.worker_id == WORKER_ID
    assert recorded.end_time.seconds >= recorded.create_time.seconds > 0

    # A repeated Delegate returns the recorded result without running again.
    requests_before = len(mesh.model.requests)
    again = await mesh.delegate(mesh.request())
    assert again[-1].result == result and len(mesh.model.requests) == requests_before
    assert again[0].started.worker_id == WORKER_ID


def test_a_worker_without_a_configured_id_names_itself_by_its_host_and_differs_from_the_next() -> None:
    first, second = default_worker_id(), default_worker_id()
    assert first.startswith(socket.gethostname()[:50]) and first != second


@OWN_MESH  # it sends the first test's delegation id
async def test_provider_failure_after_partial_text_is_a_failed_result_without_the_text(mesh: Mesh) -> None:
    article = f"{mesh.site.base_url}/article.html"
    mesh.model.script(
        Reply(calls=(Call("read_web_page", {"url": article}, "a"),)),
        Reply(calls=(Call("append_scratchpad", finding(article), "b"),)),
        DropAfter("PARTIAL-PROSE The Eiffel Tower is 33"),
    )
    events = await mesh.delegate(mesh.request())
    result = events[-1].result
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_FAILED
    assert result.error.code == common_pb2.DELEGATION_ERROR_CODE_PROVIDER_ERROR
    assert result.summary == "" and "PARTIAL-PROSE" not in str(events)
    assert list(result.promoted_sequence_nos) == [2], "entries promoted before the failure stay and are listed"
    recorded = (
        await mesh.worker.GetDelegation(worker_pb2.GetDelegationRequest(delegation_id="run-1:call-1"))
    ).delegation
    assert recorded.state == worker_pb2.DELEGATION_STATE_FAILED
    assert recorded.last_error.startswith("provider_error")


@OWN_MESH
async def test_a_model_endpoint_that_is_down_fails_the_delegation_naming_its_url_and_setting(mesh: Mesh) -> None:
    await mesh.model.stop()
    result = (await mesh.delegate(mesh.request()))[-1].result
    assert result.error.code == common_pb2.DELEGATION_ERROR_CODE_PROVIDER_ERROR
    assert f"cannot reach {mesh.model.base_url}" in result.error.message
    assert "set QUARRY_WORKER_MODEL_BASE_URL (or QUARRY_MODEL_BASE_URL for every tier)" in result.error.message


async def test_turn_budget_and_deadline_are_distinct_failures(mesh: Mesh) -> None:
    mesh.model.script(*[Reply(calls=(Call("read_scratchpad", {}, f"c{i}"),)) for i in range(3)])
    turns = await mesh.delegate(mesh.request("run-1:turns", max_turns=3))
    assert turns[-1].result.error.code == common_pb2.DELEGATION_ERROR_CODE_TURN_BUDGET_EXHAUSTED
    assert turns[-1].result.turns_used == 3

    mesh.model.script(Stall(30))
    deadline = await mesh.delegate(mesh.request("run-1:slow", timeout=duration_pb2.Duration(seconds=1)))
    assert deadline[-1].result.error.code == common_pb2.DELEGATION_ERROR_CODE_DEADLINE_EXCEEDED


async def test_a_cancelled_stream_cancels_the_delegation(mesh: Mesh) -> None:
    mesh.model.script(Stall(30))
    call = mesh.worker.Delegate(mesh.request("run-1:cancel"))
    assert (await call.read()).WhichOneof("event") == "started"
    assert (await call.read()).progress.kind == worker_pb2.PROGRESS_KIND_TURN_STARTED
    call.cancel()
    for _ in range(200):
        recorded = (
            await mesh.worker.GetDelegation(worker_pb2.GetDelegationRequest(delegation_id="run-1:cancel"))
        ).delegation
        if recorded.state != worker_pb2.DELEGATION_STATE_RUNNING:
            break
        await asyncio.sleep(0.05)
    assert recorded.state == worker_pb2.DELEGATION_STATE_FAILED
    assert recorded.result.error.code == common_pb2.DELEGATION_ERROR_CODE_CANCELLED


# Its own worker: it fills the worker's capacity, and a shared worker may still be ending another test's
# cancelled delegations.
@OWN_MESH
async def test_too_many_delegations_is_resource_exhausted(mesh: Mesh) -> None:
    mesh.model.script(Stall(30), Stall(30))
    calls = [mesh.worker.Delegate(mesh.request(f"run-1:busy-{i}")) for i in range(2)]
    for call in calls:
        await call.read()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await mesh.delegate(mesh.request("run-1:one-too-many"))
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for call in calls:
        call.cancel()


@pytest.mark.parametrize(
    "mesh",
    [("in-process", False), pytest.param(("processes", False), marks=pytest.mark.slow)],
    ids=["in-process", "processes"],
    indirect=True,
)
async def test_text_tool_protocol_end_to_end_for_a_model_without_native_tools(mesh: Mesh) -> None:
    article = f"{mesh.site.base_url}/article.html"
    read = json.dumps({"name": "read_web_page", "arguments": {"url": article}})
    append = json.dumps({"name": "append_scratchpad", "arguments": finding(article)})
    example = '```\n<tool_call>{"name": "ignored"}</tool_call>\n```'
    mesh.model.script(
        Reply(content=f"Reading the page.\n<tool_call>{read}</tool_call>"),
        Reply(content=f"Promoting.\n{example}\n<tool_call>{append}</tool_call>"),
        Reply(content="Done: entry 2."),
    )
    events = await mesh.delegate(mesh.request())
    result = events[-1].result
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED and list(result.promoted_sequence_nos) == [2]
    assert all("tools" not in request for request in mesh.model.requests)
    assert "<tool_call>" in mesh.model.requests[0]["messages"][0]["content"], "tools are taught in the system prompt"
    tool_names = [e.progress.tool_name for e in events if e.progress.kind == worker_pb2.PROGRESS_KIND_TOOL_CALLED]
    assert tool_names == ["read_web_page", "append_scratchpad"], "the fenced example was not executed"


@OWN_MESH
async def test_shutdown_ends_running_delegations_with_a_correlated_cancelled_result(mesh: Mesh) -> None:
    mesh.model.script(Stall(30))
    call = mesh.worker.Delegate(mesh.request("run-1:interrupted"))
    assert (await call.read()).WhichOneof("event") == "started"
    assert (await call.read()).progress.kind == worker_pb2.PROGRESS_KIND_TURN_STARTED
    await mesh.stop_worker()
    last = await asyncio.wait_for(call.read(), 30)
    assert last.WhichOneof("event") == "result"
    assert last.result.delegation_id == "run-1:interrupted"
    assert last.result.error.code == common_pb2.DELEGATION_ERROR_CODE_CANCELLED


@OWN_MESH
async def test_sigterm_turns_health_not_serving_at_once_and_lets_a_delegation_finish_within_the_grace(
    mesh: Mesh,
) -> None:
    mesh.model.script(Reply(content="finished in time", delay=1.0))  # within the 2 s grace
    call = mesh.worker.Delegate(mesh.request("run-1:finishing"))
    assert (await call.read()).WhichOneof("event") == "started"
    health = mesh.health.Watch(health_pb2.HealthCheckRequest(service=""))
    assert (await health.read()).status == health_pb2.HealthCheckResponse.SERVING
    stopping = asyncio.create_task(mesh.stop_worker())
    assert (await asyncio.wait_for(health.read(), 5)).status == health_pb2.HealthCheckResponse.NOT_SERVING
    while (response := await asyncio.wait_for(call.read(), 30)).WhichOneof("event") != "result":
        pass
    await stopping
    assert response.result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED
    assert response.result.summary == "finished in time"


@pytest.mark.parametrize("mesh", [IN_PROCESS], ids=["in-process"], indirect=True)
async def test_a_delegation_id_reused_for_another_request_is_refused(mesh: Mesh) -> None:
    mesh.model.script(Reply(content="done"))
    await mesh.delegate(mesh.request("run-1:same"))
    other = mesh.request("run-1:same")
    other.task.objective = "Something else entirely."
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await mesh.delegate(other)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
