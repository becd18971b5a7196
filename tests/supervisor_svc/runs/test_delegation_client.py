"""The supervisor's delegation client: one correlated result per delegation, whatever the workers do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from quarry.client import ScratchpadClient, insecure_channel
from quarry.config import QuarrySettings, ScratchpadSettings, WorkerSettings
from quarry.identity import Role
from quarry.server import ServiceHost, ServiceRegistration
from quarry.v1 import common_pb2, monitor_pb2, worker_pb2, worker_pb2_grpc
from quarry.vocabulary import JobRef
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.runs.domain import DelegationOrder
from supervisor_svc.runs.worker_client import DelegationClient
from tests.conftest import reusable_port
from tests.fakes.openai_server import Reply, ScriptedModel, Stall
from worker_svc.service import SERVICE_NAME
from worker_svc.service import build_host as build_worker


class MisbehavingWorker(worker_pb2_grpc.WorkerServiceServicer):
    """A worker that breaks the protocol in the way its delegation_id names."""

    async def Delegate(self, request: worker_pb2.DelegateRequest, context: Any) -> AsyncIterator[Any]:
        yield worker_pb2.DelegateResponse(started=worker_pb2.DelegationStarted(delegation_id=request.delegation_id))
        if request.delegation_id.endswith("no-result"):
            return
        if request.delegation_id.endswith("wrong-id"):
            yield worker_pb2.DelegateResponse(result=worker_pb2.DelegationResult(delegation_id="someone-else"))
            return
        if request.delegation_id.endswith("engineer"):  # answers with what it was sent, as an engineer's work
            job = monitor_pb2.JobRef(monitor_job_id="job-0123456789abcdef", log_path="/jobs/a.log")
            job.local.pid = 42
            echo = worker_pb2.DelegationResult(
                delegation_id=request.delegation_id,
                outcome=common_pb2.DELEGATION_OUTCOME_SUCCEEDED,
                jobs=[job],
                files_changed=[request.task.workspace_id, *request.task.criteria],
            )
            yield worker_pb2.DelegateResponse(result=echo)
            return
        raise RuntimeError("the worker crashed mid-stream")


@dataclass
class Workers:
    addresses: list[str]
    thread_id: str
    misbehaving: str


@pytest.fixture
async def workers(tmp_path: Path, model: ScriptedModel) -> AsyncIterator[Workers]:
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1)
    async with await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common) as scratchpad:
        hosts = []
        for index in range(2):
            settings = WorkerSettings(
                address="127.0.0.1:0",
                database_url=f"sqlite:///{tmp_path / f'worker{index}.db'}",
                scratchpad_address=scratchpad.address,
                model_base_url=model.base_url,
                model_name="scripted",
            )
            hosts.append(await build_worker(settings, common))
        bad = ServiceHost(
            "127.0.0.1:0",
            [
                ServiceRegistration(
                    SERVICE_NAME,
                    lambda server: worker_pb2_grpc.add_WorkerServiceServicer_to_server(MisbehavingWorker(), server),
                )
            ],
            grace=1,
        )
        async with hosts[0], hosts[1], bad, insecure_channel(scratchpad.address) as channel:
            thread = await ScratchpadClient(channel).create_thread(title="delegation client")
            yield Workers([host.address for host in hosts], thread.thread_id, bad.address)


def request(workers: Workers, delegation_id: str) -> worker_pb2.DelegateRequest:
    return worker_pb2.DelegateRequest(
        delegation_id=delegation_id,
        run_id="run-1",
        tool_call_id=delegation_id.rsplit(":", 1)[-1],
        scratchpad_thread_id=workers.thread_id,
        task=worker_pb2.ResearchTask(objective="Report."),
        role=common_pb2.ROLE_RESEARCHER,
    )


async def which_worker(address: str, delegation_id: str) -> bool:
    async with insecure_channel(address) as channel:
        try:
            await worker_pb2_grpc.WorkerServiceStub(channel).GetDelegation(
                worker_pb2.GetDelegationRequest(delegation_id=delegation_id)
            )
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND
            return False
    return True


async def test_delegations_are_spread_round_robin_and_events_forwarded(workers: Workers, model: ScriptedModel) -> None:
    model.script(Reply(content="one"), Reply(content="two"))
    client = DelegationClient(workers.addresses)
    events: list[str] = []
    first = await client.delegate(request(workers, "run-1:a"), on_event=lambda e: events.append(e.WhichOneof("event")))
    second = await client.delegate(request(workers, "run-1:b"))
    await client.close()
    assert (first.summary, second.summary) == ("one", "two")
    assert events[0] == "started" and "progress" in events and "result" not in events
    assert await which_worker(workers.addresses[0], "run-1:a") and await which_worker(workers.addresses[1], "run-1:b")
    assert not await which_worker(workers.addresses[1], "run-1:a")


async def test_an_unreachable_worker_is_retried_once_on_the_next(workers: Workers, model: ScriptedModel) -> None:
    model.script(Reply(content="done elsewhere"))
    client = DelegationClient([f"127.0.0.1:{reusable_port()}", workers.addresses[0]])
    result = await client.delegate(request(workers, "run-1:retry"), deadline_seconds=30)
    await client.close()
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED and result.summary == "done elsewhere"


async def test_a_worker_that_served_and_comes_back_on_its_address_is_waited_for(
    tmp_path: Path, workers: Workers, model: ScriptedModel, caplog: pytest.LogCaptureFixture
) -> None:
    model.script(Reply(content="before"), Reply(content="after the restart"))
    settings = WorkerSettings(
        address=f"127.0.0.1:{reusable_port()}",
        database_url=f"sqlite:///{tmp_path / 'restarting.db'}",
        model_base_url=model.base_url,
        model_name="scripted",
    )
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1)
    client = DelegationClient([settings.address], reconnect_wait=30)
    async with await build_worker(settings, common):
        assert (await client.delegate(request(workers, "run-1:before"), deadline_seconds=30)).summary == "before"
    # The worker is gone: the first attempt fails at once, the second waits for it to come back.
    pending = asyncio.create_task(client.delegate(request(workers, "run-1:after"), deadline_seconds=60))
    for _ in range(200):
        if "trying another" in caplog.text or pending.done():
            break
        await asyncio.sleep(0.05)
    assert not pending.done(), "the delegation gave up on a worker that served before"
    async with await build_worker(settings, common):
        result = await pending
    await client.close()
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED and result.summary == "after the restart"


async def test_no_reachable_worker_is_one_correlated_error(workers: Workers) -> None:
    client = DelegationClient([f"127.0.0.1:{reusable_port()}", f"127.0.0.1:{reusable_port()}"])
    result = await client.delegate(request(workers, "run-1:nobody"), deadline_seconds=30)
    await client.close()
    assert (result.delegation_id, result.tool_call_id) == ("run-1:nobody", "nobody")
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_FAILED
    assert result.error.code == common_pb2.DELEGATION_ERROR_CODE_WORKER_UNAVAILABLE


async def test_a_deadline_is_a_deadline_result(workers: Workers, model: ScriptedModel) -> None:
    model.script(Stall(30))
    client = DelegationClient(workers.addresses[:1])
    result = await client.delegate(request(workers, "run-1:slow"), deadline_seconds=1)
    await client.close()
    assert result.delegation_id == "run-1:slow"
    assert result.error.code == common_pb2.DELEGATION_ERROR_CODE_DEADLINE_EXCEEDED


@pytest.mark.parametrize(
    ("suffix", "code"),
    [
        ("no-result", common_pb2.DELEGATION_ERROR_CODE_PROTOCOL_VIOLATION),
        ("wrong-id", common_pb2.DELEGATION_ERROR_CODE_PROTOCOL_VIOLATION),
        ("crash", common_pb2.DELEGATION_ERROR_CODE_WORKER_UNAVAILABLE),
    ],
)
async def test_a_misbehaving_worker_still_yields_one_correlated_error(workers: Workers, suffix: str, code: int) -> None:
    client = DelegationClient([workers.misbehaving])
    result = await client.delegate(request(workers, f"run-1:{suffix}"), deadline_seconds=30)
    await client.close()
    assert result.delegation_id == f"run-1:{suffix}"
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_FAILED
    assert result.error.code == code


async def test_an_engineer_order_carries_its_workspace_and_its_result_the_jobs_and_files(workers: Workers) -> None:
    order = DelegationOrder(
        delegation_id="run-1:engineer",
        run_id="run-1",
        tool_call_id="engineer",
        scratchpad_thread_id=workers.thread_id,
        objective="Make it converge faster.",
        criteria=("train.py",),
        input_refs=(),
        role=Role.ENGINEER,
        max_turns=0,
        max_tokens=0,
        timeout_seconds=30,
        workspace_id="ws-0123456789abcdef",
    )

    async def on_turn(turn: int, max_turns: int, worker_id: str) -> None:
        pass

    client = DelegationClient([workers.misbehaving])
    result = await client.run(order, deadline_seconds=30, on_turn=on_turn)
    await client.close()
    assert result.succeeded
    assert result.files_changed == ("ws-0123456789abcdef", "train.py"), "the worker was sent the workspace"
    assert result.jobs == (JobRef("local", pid=42, log_path="/jobs/a.log", monitor_job_id="job-0123456789abcdef"),)
