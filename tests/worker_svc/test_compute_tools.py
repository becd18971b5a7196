"""The `compute` capability: gpu_status and job_status call the monitor over gRPC, for roles that subscribe."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from monitor_svc.service import build_host as build_monitor
from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import MonitorSettings, QuarrySettings, ScratchpadSettings, WorkerSettings
from quarry.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from scratchpad_svc.service import build_host as build_scratchpad
from tests.fakes.openai_server import Call, Reply, ScriptedModel
from tests.monitor_svc.test_gpus import fake_nvml
from worker_svc.service import build_host as build_worker


async def delegate(
    stub: worker_pb2_grpc.WorkerServiceStub, thread_id: str, delegation_id: str, role: int
) -> worker_pb2.DelegationResult:
    request = worker_pb2.DelegateRequest(
        delegation_id=delegation_id,
        run_id="run-compute",
        scratchpad_thread_id=thread_id,
        task=worker_pb2.ResearchTask(
            objective="Is the training job still running, and on which GPU?", input_refs=["1"]
        ),
        role=role,  # type: ignore[arg-type]
    )
    async for response in stub.Delegate(request, timeout=60):
        if response.WhichOneof("event") == "result":
            return response.result
    raise AssertionError("no result")


async def test_a_researcher_checks_gpus_and_a_job_through_the_monitor(
    tmp_path: Path, model: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    training = await asyncio.create_subprocess_exec("sleep", "30")
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1)
    monitor = await build_monitor(MonitorSettings(address="127.0.0.1:0"), common)
    scratchpad = await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common)
    async with monitor, scratchpad:
        worker = await build_worker(
            WorkerSettings(
                address="127.0.0.1:0",
                scratchpad_address=scratchpad.address,
                monitor_address=monitor.address,
                model_base_url=model.base_url,
                model_name="scripted",
            ),
            common,
        )
        model.script(
            Reply(
                calls=(
                    Call("gpu_status", {}, "gpus"),
                    Call("job_status", {"kind": "local", "pid": training.pid}, "job"),
                    Call("job_status", {"kind": "slurm", "host": "nowhere", "job_id": "1"}, "bad-host"),
                )
            ),
            Reply(content="The job runs; GPU 0 is busy."),
            # A verifier ends with a claim verdict: prose twice is its output invalid (its tools are the point).
            Reply(content="A verifier has no compute tools."),
            Reply(content="Still none."),
        )
        async with worker, insecure_channel(scratchpad.address) as sp, insecure_channel(worker.address) as channel:
            thread = await ScratchpadClient(sp).create_thread(title="compute")
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            result = await delegate(stub, thread.thread_id, "compute-1", common_pb2.ROLE_RESEARCHER)
            verifier = await delegate(stub, thread.thread_id, "compute-2", common_pb2.ROLE_VERIFIER)
    training.kill()
    await training.wait()
    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result
    assert verifier.error.code == common_pb2.DELEGATION_ERROR_CODE_OUTPUT_INVALID, verifier
    offered = [tool["function"]["name"] for tool in model.requests[0]["tools"]]
    assert "gpu_status" in offered and "job_status" in offered
    results = {m["tool_call_id"]: m["content"] for m in model.requests[1]["messages"] if m["role"] == "tool"}
    assert "local #0 NVIDIA H200: 87% busy" in results["gpus"] and "4242" in results["gpus"]
    assert results["job"].startswith("running") and str(training.pid) in results["job"]
    assert results["bad-host"].startswith("error:") and "nowhere" in results["bad-host"]
    not_offered = [tool["function"]["name"] for tool in model.requests[2]["tools"]]
    assert "gpu_status" not in not_offered and "read_web_page" in not_offered
