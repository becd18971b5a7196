"""Side by side: what one agent turn costs beyond the model, in Quarry and in the loops it competes with.

    python3 bench/compare.py [--delegations 60] [--rounds 5]
        [--contenders httpx,openai,langgraph,langgraph-sqlite,quarry,quarry-postgresql]

One run, one scripted OpenAI-compatible model (in this process), one scratchpad
(`quarry serve scratchpad`). Every contender runs the same delegation, in a
process of its own: turn 1 calls `read_scratchpad` (a Read over gRPC from that
scratchpad), turn 2 answers. Overhead = a delegation's wall time minus the time
the model server spent answering it, per turn (2 turns).
  - httpx: a bare loop over one httpx client, parsing the stream by hand;
  - openai: the same loop over the openai SDK (AsyncOpenAI, streaming);
  - langgraph: a supervisor node handing the task to a ReAct worker subgraph
    (langgraph.prebuilt.create_react_agent over langchain-openai's ChatOpenAI,
    streaming), its updates streamed to the caller, no checkpointer;
  - langgraph-sqlite: the same with the durable AsyncSqliteSaver checkpointer;
  - quarry: Delegate calls to `quarry serve worker` (SQLite, mesh tokens), its
    progress streamed back: the worker records the delegation, its conversation
    and its outcome durably;
  - quarry-postgresql: the same worker on a fresh schema of PostgreSQL
    (QUARRY_TEST_POSTGRES_URL, default the local `test` database).
Every contender runs once per round, in an order that rotates between rounds;
ratios are taken within a round (bench/rounds.py).
The contenders outside Quarry come with the bench extra: pip install -e '.[bench]'.
Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import tempfile
import time
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from harness import (
    POSTGRES_URL,
    arguments,
    mesh_environment,
    mesh_token,
    peak_rss_mib,
    percentile,
    postgres_schema,
    running_service,
)
from rounds import MIN_ROUNDS, Rounds

from quarry.clients.channels import open_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.identity import MeshRole
from quarry.research_plane import ResearchPlane
from quarry.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from tests.fakes.openai_server import Call, Reply, ScriptedModel, Step

CONTENDERS = ("httpx", "openai", "langgraph", "langgraph-sqlite", "quarry", "quarry-postgresql")
WARM_UP = 5
OBJECTIVE = "Read the scratchpad and report."
READ_TOOL = {
    "type": "function",
    "function": {
        "name": "read_scratchpad",
        "description": "Read the shared research scratchpad.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def two_turns(body: dict[str, Any]) -> Step:
    if body["messages"][-1]["role"] == "tool":
        return Reply(content="done")
    return Reply(calls=(Call("read_scratchpad", {}),))


def render(entries: list[Any]) -> str:
    return "\n".join(f"[{entry.sequence_no}] {entry.kind}: {entry.content}" for entry in entries) or "empty"


# -- the contenders, each in a process of its own -------------------------------------------------


def assistant_message(text: list[str], calls: dict[int, dict[str, str]]) -> dict[str, Any]:
    """The assistant's message from a stream's text pieces and its tool calls assembled by index."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(calls.items())
        ]
    return message


async def httpx_turn(client: Any, messages: list[dict[str, Any]], *, url: str) -> dict[str, Any]:
    """One streamed turn over a bare httpx client, the stream parsed by hand: the assistant's message."""
    request = {"model": "scripted", "messages": messages, "tools": [READ_TOOL], "stream": True}
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    async with client.stream("POST", url, json=request, headers={"authorization": "Bearer unused"}) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice["delta"]
                text.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or ():
                    slot = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.get("id") or slot["id"]
                    slot["name"] += call["function"].get("name") or ""
                    slot["arguments"] += call["function"].get("arguments") or ""
    return assistant_message(text, calls)


async def bare_httpx(model_url: str, read: Any, count: int) -> list[float]:
    import httpx

    complete = functools.partial(httpx_turn, url=f"{model_url}/chat/completions")
    async with httpx.AsyncClient(timeout=60) as client:
        return [await _timed(lambda: run_delegation(complete, client, read)) for _ in range(count)]


async def bare_openai(model_url: str, read: Any, count: int) -> list[float]:
    import openai

    # Typed loosely: the bench passes plain dicts, as the other loops do.
    async def complete(client: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
        stream = await client.chat.completions.create(
            model="scripted",
            messages=messages,
            tools=[READ_TOOL],
            stream=True,
        )
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        async for chunk in stream:
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                for call in choice.delta.tool_calls or ():
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.id or slot["id"]
                    slot["name"] += (call.function and call.function.name) or ""
                    slot["arguments"] += (call.function and call.function.arguments) or ""
        return assistant_message(text, calls)

    async with openai.AsyncOpenAI(base_url=model_url, api_key="unused", max_retries=0) as client:
        return [await _timed(lambda: run_delegation(complete, client, read)) for _ in range(count)]


async def run_delegation(complete: Any, client: Any, read: Any) -> None:
    """One two-turn delegation: `complete(client, messages)` answers each turn, `read()` runs the tool."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You research."},
        {"role": "user", "content": OBJECTIVE},
    ]
    while True:
        message = await complete(client, messages)
        messages.append(message)
        if not message.get("tool_calls"):
            return
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": await read()})


async def _timed(run: Any) -> float:
    started = time.perf_counter()
    await run()
    return time.perf_counter() - started


async def langgraph(model_url: str, read: Any, count: int, checkpoints: str) -> list[float]:
    from typing import TypedDict

    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph
    from langgraph.prebuilt import create_react_agent
    from pydantic import SecretStr

    # Moved to langchain.agents (a package LangGraph does not need); the prebuilt one is the same graph.
    warnings.filterwarnings("ignore", message="create_react_agent has been moved")

    @tool
    async def read_scratchpad() -> str:
        """Read the shared research scratchpad."""
        return str(await read())

    chat = ChatOpenAI(model="scripted", base_url=model_url, api_key=SecretStr("unused"), streaming=True, max_retries=0)
    worker = create_react_agent(chat, [read_scratchpad], prompt="You research.")

    class Run(TypedDict, total=False):
        objective: str
        summary: str

    async def supervisor(state: Run) -> Run:
        result = await worker.ainvoke({"messages": [("user", state["objective"])]})
        return {"summary": result["messages"][-1].content}

    graph = StateGraph(Run)
    graph.add_node("supervisor", supervisor)
    graph.add_edge(START, "supervisor")
    graph.add_edge("supervisor", END)

    async def delegate(app: Any, n: int) -> None:
        config = {"configurable": {"thread_id": f"d{n}"}}
        async for _ in app.astream({"objective": OBJECTIVE}, config, stream_mode="updates", subgraphs=True):
            pass

    if not checkpoints:
        app = graph.compile()
        return [await _timed(lambda n=n: delegate(app, n)) for n in range(count)]
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(checkpoints) as saver:
        app = graph.compile(checkpointer=saver)
        return [await _timed(lambda n=n: delegate(app, n)) for n in range(count)]


async def contender_main(args: argparse.Namespace) -> None:
    async with open_channel(args.scratchpad, token=mesh_token(MeshRole.WORKER)) as channel:
        plane = ResearchPlane(ScratchpadClient(channel))

        async def read() -> str:
            return render(await plane.read_all(args.thread))

        count = WARM_UP + args.delegations
        if args.contender == "httpx":
            times = await bare_httpx(args.model_url, read, count)
        elif args.contender == "openai":
            times = await bare_openai(args.model_url, read, count)
        else:
            checkpoints = str(Path(args.workdir) / "checkpoints.db") if args.contender == "langgraph-sqlite" else ""
            times = await langgraph(args.model_url, read, count, checkpoints)
    print(json.dumps(times))


# -- the benchmark ---------------------------------------------------------------------------------


async def quarry_worker(worker_address: str, thread_id: str, count: int, round_index: int) -> list[float]:
    async with open_channel(worker_address, token=mesh_token(MeshRole.SUPERVISOR)) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)

        async def delegate(n: int) -> None:
            request = worker_pb2.DelegateRequest(
                delegation_id=f"compare-{round_index}-{n}",
                run_id="compare",
                tool_call_id=f"compare-{round_index}-{n}",
                scratchpad_thread_id=thread_id,
                task=worker_pb2.ResearchTask(objective=OBJECTIVE),
                role=common_pb2.ROLE_RESEARCHER,
            )
            async for event in stub.Delegate(request, timeout=60):
                if event.WhichOneof("event") == "result":
                    assert event.result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, event.result

        return [await _timed(lambda n=n: delegate(n)) for n in range(count)]


async def main_async(args: argparse.Namespace) -> None:
    contenders = [name for name in args.contenders.split(",") if name]
    unknown = set(contenders) - set(CONTENDERS)
    if unknown:
        raise SystemExit(f"unknown contenders: {', '.join(sorted(unknown))}")
    rounds = Rounds("compare", args.rounds)
    with tempfile.TemporaryDirectory() as workdir_name, ExitStack() as services:
        workdir = Path(workdir_name)
        env = {"QUARRY_DATA_DIR": str(workdir), "QUARRY_LOG_LEVEL": "WARNING"}
        async with ScriptedModel() as model:
            model.default = two_turns
            _, scratchpad = services.enter_context(
                running_service("scratchpad", {**env, **mesh_environment(None)}, workdir)
            )
            workers: dict[str, tuple[int, str]] = {}
            for name in contenders:
                if name.startswith("quarry"):
                    database = {}
                    if name == "quarry-postgresql":
                        database = {
                            "QUARRY_WORKER_DATABASE_URL": services.enter_context(postgres_schema(args.postgres_url))
                        }
                    worker_env = {
                        **env,
                        **mesh_environment(MeshRole.WORKER),
                        **database,
                        "QUARRY_WORKER_SCRATCHPAD_ADDRESS": scratchpad,
                        "QUARRY_WORKER_MODEL_BASE_URL": model.base_url,
                        "QUARRY_WORKER_MODEL_NAME": "scripted",
                    }
                    process, address = services.enter_context(running_service("worker", worker_env, workdir / name))
                    workers[name] = (process.pid, address)
            async with open_channel(scratchpad, token=mesh_token(MeshRole.SUPERVISOR)) as channel:
                thread_id = (await ScratchpadClient(channel).create_thread(title="compare")).thread_id
            for index in rounds:
                for name in rounds.order(contenders, index):
                    model.service_times.clear()
                    if name in workers:
                        times = await quarry_worker(workers[name][1], thread_id, WARM_UP + args.delegations, index)
                    else:
                        times = await run_contender(name, args, model.base_url, scratchpad, thread_id, workdir)
                    service = model.service_times
                    assert len(service) == 2 * len(times), (name, len(service), len(times))
                    overhead = [
                        (wall - service[2 * n] - service[2 * n + 1]) * 1000 / 2
                        for n, wall in enumerate(times)
                        if n >= WARM_UP
                    ]
                    rounds.record(f"{name} p50", percentile(overhead, 0.5), "ms a turn")
                    rounds.record(f"{name} p99", percentile(overhead, 0.99), "ms a turn")
            for name, (pid, _) in workers.items():
                rounds.record(f"{name} worker peak RSS", peak_rss_mib(pid), "MiB")
    for name in workers:
        for base in ("openai", "httpx", "langgraph", "langgraph-sqlite"):
            if base in contenders:
                rounds.ratio(f"{name} / {base} at p50", f"{name} p50", f"{base} p50")
    print(
        f"overhead per turn beyond the model, {args.delegations} sequential two-turn delegations per contender a round"
    )
    print("(goals: quarry <= 1.5x openai and <= 3x httpx at p50)")
    rounds.report()


async def run_contender(
    name: str, args: argparse.Namespace, model_url: str, scratchpad: str, thread_id: str, workdir: Path
) -> list[float]:
    command = [sys.executable, __file__, "--contender", name, "--model-url", model_url, "--scratchpad", scratchpad]
    command += ["--thread", thread_id, "--delegations", str(args.delegations), "--workdir", str(workdir)]
    process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, env=os.environ.copy())
    stdout, _ = await process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"{name} failed (exit {process.returncode}); is the bench extra installed?")
    times: list[float] = json.loads(stdout.decode().strip().splitlines()[-1])
    return times


def main() -> None:
    args = arguments(
        __doc__,
        delegations=60,
        rounds=MIN_ROUNDS,
        contenders=",".join(CONTENDERS),
        postgres_url=POSTGRES_URL,
        contender="",
        model_url="",
        scratchpad="",
        thread="",
        workdir="",
    )
    if args.contender:
        asyncio.run(contender_main(args))
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
