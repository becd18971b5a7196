"""Worker benchmark: mesh overhead per turn and per delegation, and concurrent delegations per process.

    python3 bench/worker.py [--delegations 40] [--concurrent 200] [--latency 0.5]

Starts `quarry serve scratchpad` and `quarry serve worker` as their own
processes (SQLite), with the scripted OpenAI-compatible model in this process.
  - Overhead: sequential delegations of two turns each (read_scratchpad, then
    the answer) against a model that answers at once. Overhead = the
    Delegate call's wall time minus the time the model server spent answering,
    divided per delegation and per turn.
  - Concurrency: N delegations at once against a model that takes `latency`
    seconds per turn; reports how many succeeded, the wall time, and the
    worker's peak RSS.
Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from harness import arguments, mesh_environment, mesh_token, peak_rss_mib, percentile, running_service

from quarry.clients.channels import open_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.identity import MeshRole
from quarry.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from tests.fakes.openai_server import Call, Reply, ScriptedModel, Step


def two_turns(latency: float) -> Any:
    def answer(body: dict[str, Any]) -> Step:
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="done", delay=latency)
        return Reply(calls=(Call("read_scratchpad", {}),), delay=latency)

    return answer


async def delegate(
    stub: worker_pb2_grpc.WorkerServiceStub, thread_id: str, delegation_id: str
) -> worker_pb2.DelegationResult:
    request = worker_pb2.DelegateRequest(
        delegation_id=delegation_id,
        run_id="bench",
        tool_call_id=delegation_id,
        scratchpad_thread_id=thread_id,
        task=worker_pb2.ResearchTask(objective="Read the scratchpad and report."),
        role=common_pb2.ROLE_RESEARCHER,
    )
    result = None
    async for event in stub.Delegate(request, timeout=600):
        if event.WhichOneof("event") == "result":
            result = event.result
    assert result is not None
    return result


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as workdir_name:
        workdir = Path(workdir_name)
        env = {"QUARRY_DATA_DIR": str(workdir), "QUARRY_LOG_LEVEL": "WARNING"}
        async with ScriptedModel() as model:
            with (
                running_service("scratchpad", {**env, **mesh_environment(None)}, workdir) as (_, scratchpad_address),
                running_service(
                    "worker",
                    {
                        **env,
                        **mesh_environment(MeshRole.WORKER),
                        "QUARRY_WORKER_SCRATCHPAD_ADDRESS": scratchpad_address,
                        "QUARRY_WORKER_MODEL_BASE_URL": model.base_url,
                        "QUARRY_WORKER_MODEL_NAME": "scripted",
                        "QUARRY_WORKER_MAX_CONCURRENT_DELEGATIONS": str(args.concurrent + 10),
                    },
                    workdir,
                ) as (worker, worker_address),
            ):
                await measure(args, model, worker.pid, scratchpad_address, worker_address)


async def measure(
    args: argparse.Namespace, model: ScriptedModel, worker_pid: int, scratchpad_address: str, worker_address: str
) -> None:
    async with (
        open_channel(scratchpad_address, token=mesh_token(MeshRole.SUPERVISOR)) as sp_channel,
        open_channel(worker_address, token=mesh_token(MeshRole.SUPERVISOR)) as channel,
    ):
        thread = await ScratchpadClient(sp_channel).create_thread(title="bench")
        stub = worker_pb2_grpc.WorkerServiceStub(channel)

        model.default = two_turns(0.0)
        await delegate(stub, thread.thread_id, "warm-up")
        per_delegation: list[float] = []
        for index in range(args.delegations):
            model.service_times.clear()
            started = time.perf_counter()
            result = await delegate(stub, thread.thread_id, f"seq-{index}")
            elapsed = time.perf_counter() - started
            assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result
            per_delegation.append((elapsed - sum(model.service_times)) * 1000)
        per_turn = [value / 2 for value in per_delegation]
        print(f"mesh overhead, {args.delegations} sequential delegations of 2 turns, zero-latency model:")
        for label, values in (("per delegation", per_delegation), ("per turn", per_turn)):
            p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
            print(f"  {label}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")

        model.default = two_turns(args.latency)
        started = time.perf_counter()
        results = await asyncio.gather(
            *(delegate(stub, thread.thread_id, f"par-{index}") for index in range(args.concurrent)),
            return_exceptions=True,
        )
        elapsed = time.perf_counter() - started
        succeeded = sum(
            1
            for r in results
            if isinstance(r, worker_pb2.DelegationResult) and r.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED
        )
        failures = Counter(
            repr(r) if not isinstance(r, worker_pb2.DelegationResult) else f"{r.error_code}: {r.error_message}"
            for r in results
            if not isinstance(r, worker_pb2.DelegationResult) or r.outcome != common_pb2.DELEGATION_OUTCOME_SUCCEEDED
        )
        for failure, count in failures.items():
            print(f"  {count} failed: {failure[:300]}")
        print(
            f"{args.concurrent} concurrent delegations, {args.latency * 1000:.0f} ms per model turn (2 turns): "
            f"{succeeded} succeeded in {elapsed:.2f} s (ideal {2 * args.latency:.2f} s); "
            f"worker peak RSS {peak_rss_mib(worker_pid):.0f} MiB"
        )


def main() -> None:
    asyncio.run(main_async(arguments(__doc__, delegations=40, concurrent=200, latency=0.5)))


if __name__ == "__main__":
    main()
