"""Worker benchmark: mesh overhead per turn, and 200 concurrent delegations against a bare httpx loop.

    python3 bench/worker.py [--rounds 5] [--delegations 20] [--concurrent 200] [--latency 0.5] [--keepalive 20]

Starts `quarry serve scratchpad` and `quarry serve worker` as their own
processes (SQLite), with the scripted OpenAI-compatible model in this process.
Each round runs, in an order that rotates from round to round:
  - sequential: delegations of two turns each (read_scratchpad, then the
    answer) one after another against a model that answers at once; overhead
    = the Delegate call's wall time minus the time the model server spent
    answering, per turn (p50 of the round);
  - quarry: `concurrent` delegations at once against a model that takes
    `latency` seconds per turn (two turns: ideal 2 x latency);
  - bare httpx: the same two-turn delegations, as many at once, done by a bare
    loop over one httpx client (bench/compare.py's, stream parsed by hand, the
    scratchpad read over gRPC) in a process of its own; its client allows
    `concurrent` connections and keeps `keepalive` of them idle (20: httpx's
    default).
Reports each figure as median (range) over the rounds, the ratio quarry / bare
httpx per round (goal: at most 1.3x), and the worker's peak RSS (VmHWM, since
it started; goal: at most 150 MiB). Figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from compare import httpx_turn, render, run_delegation
from harness import arguments, mesh_environment, mesh_token, peak_rss_mib, percentile, running_service
from rounds import Rounds

from quarry.clients.channels import open_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.identity import MeshRole
from quarry.research_plane import ResearchPlane
from quarry.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from tests.fakes.openai_server import Call, Reply, ScriptedModel, Step

PARTS = ("sequential", "quarry", "bare httpx")


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


# -- the bare httpx loop, in a process of its own --------------------------------------------------


async def bare_httpx_main(args: argparse.Namespace) -> None:
    import httpx

    async with open_channel(args.scratchpad, token=mesh_token(MeshRole.WORKER)) as channel:
        plane = ResearchPlane(ScratchpadClient(channel))

        async def read() -> str:
            return render(await plane.read_all(args.thread))

        complete = functools.partial(httpx_turn, url=f"{args.model_url}/chat/completions")
        limits = httpx.Limits(max_connections=args.concurrent, max_keepalive_connections=args.keepalive)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            await run_delegation(complete, client, read)  # warm-up
            started = time.perf_counter()
            await asyncio.gather(*(run_delegation(complete, client, read) for _ in range(args.concurrent)))
            print(json.dumps({"wall": time.perf_counter() - started}))


async def bare_httpx(args: argparse.Namespace, model_url: str, scratchpad: str, thread_id: str) -> float:
    command = [sys.executable, __file__, "--bare-httpx", "1", "--model-url", model_url, "--scratchpad", scratchpad]
    command += ["--thread", thread_id, "--concurrent", str(args.concurrent), "--keepalive", str(args.keepalive)]
    process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
    stdout, _ = await process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the bare httpx loop failed (exit {process.returncode})")
    wall: float = json.loads(stdout.decode().strip().splitlines()[-1])["wall"]
    return wall


# -- the benchmark ---------------------------------------------------------------------------------


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
                        # Room for a round's delegations whose tasks are still ending as the next part starts.
                        "QUARRY_WORKER_MAX_CONCURRENT_DELEGATIONS": str(2 * args.concurrent + args.delegations),
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
        thread_id = (await ScratchpadClient(sp_channel).create_thread(title="bench")).thread_id
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        model.default = two_turns(0.0)
        await delegate(stub, thread_id, "warm-up")
        rounds = Rounds("worker", count=args.rounds)
        for index in rounds:
            for part in rounds.order(PARTS, index):
                if part == "sequential":
                    model.default = two_turns(0.0)
                    rounds.record(
                        "overhead per turn, sequential p50", await sequential(args, model, stub, thread_id, index), "ms"
                    )
                elif part == "quarry":
                    model.default = two_turns(args.latency)
                    rounds.record(
                        f"quarry {args.concurrent} concurrent", await concurrent(args, stub, thread_id, index), "s"
                    )
                else:
                    model.default = two_turns(args.latency)
                    wall = await bare_httpx(args, model.base_url, scratchpad_address, thread_id)
                    rounds.record(f"bare httpx {args.concurrent} concurrent", wall, "s")
            rounds.record("worker peak RSS", peak_rss_mib(worker_pid), "MiB")
        rounds.ratio(
            "quarry / bare httpx", f"quarry {args.concurrent} concurrent", f"bare httpx {args.concurrent} concurrent"
        )
        print(
            f"(ideal {2 * args.latency:.2f} s for {args.concurrent} concurrent delegations of 2 turns; goals: "
            "quarry / bare httpx <= 1.3x, worker peak RSS <= 150 MiB)"
        )
        rounds.report()


async def sequential(
    args: argparse.Namespace, model: ScriptedModel, stub: worker_pb2_grpc.WorkerServiceStub, thread_id: str, index: int
) -> float:
    per_turn = []
    for n in range(args.delegations):
        model.service_times.clear()
        started = time.perf_counter()
        result = await delegate(stub, thread_id, f"seq-{index}-{n}")
        elapsed = time.perf_counter() - started
        assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result
        per_turn.append((elapsed - sum(model.service_times)) * 1000 / 2)
    return percentile(per_turn, 0.5)


async def concurrent(
    args: argparse.Namespace, stub: worker_pb2_grpc.WorkerServiceStub, thread_id: str, index: int
) -> float:
    started = time.perf_counter()
    results = await asyncio.gather(
        *(delegate(stub, thread_id, f"par-{index}-{n}") for n in range(args.concurrent)), return_exceptions=True
    )
    elapsed = time.perf_counter() - started
    failures = Counter(
        repr(r) if not isinstance(r, worker_pb2.DelegationResult) else f"{r.error.code}: {r.error.message}"
        for r in results
        if not isinstance(r, worker_pb2.DelegationResult) or r.outcome != common_pb2.DELEGATION_OUTCOME_SUCCEEDED
    )
    for failure, count in failures.items():
        print(f"  {count} failed: {failure[:300]}")
    if failures:
        raise SystemExit(f"{sum(failures.values())} of {args.concurrent} concurrent delegations failed")
    return elapsed


def main() -> None:
    args = arguments(
        __doc__,
        rounds=5,
        delegations=20,
        concurrent=200,
        latency=0.5,
        keepalive=20,
        bare_httpx=0,
        model_url="",
        scratchpad="",
        thread="",
    )
    asyncio.run(bare_httpx_main(args) if args.bare_httpx else main_async(args))


if __name__ == "__main__":
    main()
