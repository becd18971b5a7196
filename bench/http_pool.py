"""HTTP clients side by side on streamed chat replies: time and client CPU per request, and connections opened.

    python3 bench/http_pool.py [--rounds 5] [--sequential 100] [--concurrent 200] [--requests 300]
                               [--delay 0.0] [--clients httpx,httpx2,aiohttp,pool,model-client]

A minimal OpenAI-compatible SSE server runs in a process of its own (aiohttp;
each reply is six SSE events then [DONE], written one by one after `delay`
seconds) and counts the TCP connections it accepts. Each round, in an order
that rotates, every client runs twice on a fresh instance: `sequential`
requests one at a time (concurrency 1), then `requests` requests from
`concurrent` tasks at once (concurrency 200), each stream read to its end.
  - httpx: httpx.AsyncClient, its default pool (httpcore), limits 1000/1000, as Quarry had;
  - httpx2: httpx2.AsyncClient (httpx's successor, where installed), the same limits;
  - aiohttp: aiohttp.ClientSession over a TCPConnector limited to 1000;
  - pool: httpx.AsyncClient over quarry.agent.pool.PooledTransport, the same limits;
  - model-client: quarry.agent.model.ModelClient.complete, the whole client (over `pool`).
Reported per client and concurrency: wall time per request (the batch's wall
time / its requests), this process's CPU per request (the server's is not in
it), and connections the server accepted for the batch. Figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

from harness import arguments
from rounds import Rounds

from quarry.agent.messages import user
from quarry.agent.model import ModelClient, ModelSettings
from quarry.agent.pool import PooledTransport

CLIENTS = ("httpx", "httpx2", "aiohttp", "pool", "model-client")
LIMIT = 1000
REQUEST = {"model": "bench", "messages": [{"role": "user", "content": "Say hello."}], "stream": True}


def _event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "bench", "choices": []}
    if delta or finish:
        chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    else:
        chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    return f"data: {json.dumps(chunk)}\n\n".encode()


EVENTS = [
    _event({"role": "assistant", "content": ""}),
    *(_event({"content": word}) for word in ("Hello", ", ", "world", ".")),
    _event({}, "stop"),
    _event({}),
    b"data: [DONE]\n\n",
]


# -- the server, in a process of its own ------------------------------------------------------------


async def serve(delay: float) -> None:
    from aiohttp import web

    accepts = 0

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        if delay:
            await asyncio.sleep(delay)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in EVENTS:
            await response.write(event)
        await response.write_eof()
        return response

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"accepts": accepts})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    handler = runner.server
    assert handler is not None

    def accepted() -> Any:
        nonlocal accepts
        accepts += 1
        return handler()

    server = await asyncio.get_running_loop().create_server(accepted, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin


# -- the clients --------------------------------------------------------------------------------------

Send = Callable[[], Awaitable[None]]


async def httpx_like(module: Any, url: str, transport: Any = None) -> tuple[Send, Callable[[], Awaitable[None]]]:
    limits = module.Limits(max_connections=LIMIT, max_keepalive_connections=LIMIT)
    client = module.AsyncClient(timeout=60, limits=limits, transport=transport)
    body = json.dumps(REQUEST).encode()

    async def send() -> None:
        async with client.stream("POST", url, content=body, headers={"content-type": "application/json"}) as response:
            async for _ in response.aiter_lines():
                pass

    return send, client.aclose


async def aiohttp_client(url: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=LIMIT))
    body = json.dumps(REQUEST).encode()

    async def send() -> None:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
            async for _ in response.content:
                pass

    return send, session.close


async def model_client(base_url: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    client = ModelClient(ModelSettings(base_url=base_url, model="bench"))
    history = [user("Say hello.")]

    async def send() -> None:
        reply = await client.complete(history, call_id_prefix="b")
        assert reply.message.content == "Hello, world.", reply

    return send, client.close


async def open_client(name: str, base_url: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    url = f"{base_url}/chat/completions"
    if name == "httpx":
        import httpx

        return await httpx_like(httpx, url)
    if name == "httpx2":
        import httpx2

        return await httpx_like(httpx2, url)
    if name == "aiohttp":
        return await aiohttp_client(url)
    if name == "pool":
        import httpx

        transport = PooledTransport(httpx.Limits(max_connections=LIMIT, max_keepalive_connections=LIMIT))
        return await httpx_like(httpx, url, transport)
    return await model_client(base_url)


# -- the benchmark --------------------------------------------------------------------------------------


def accepts(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as response:
        count: int = json.load(response)["accepts"]
    return count


async def batch(send: Send, tasks: int, requests: int) -> None:
    """`requests` requests from `tasks` tasks at once, each task sending its share one after another."""
    share, extra = divmod(requests, tasks)

    async def task(count: int) -> None:
        for _ in range(count):
            await send()

    await asyncio.gather(*(task(share + (index < extra)) for index in range(tasks)))


async def measure(rounds: Rounds, name: str, port: int, tasks: int, requests: int, label: str) -> None:
    send, close = await open_client(name, f"http://127.0.0.1:{port}/v1")
    try:
        before = accepts(port)
        wall, cpu = time.perf_counter(), time.process_time()
        await batch(send, tasks, requests)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        opened = accepts(port) - before - 1  # less the connection that asked for `before`
    finally:
        await close()
    rounds.record(f"{name} {label} wall/request", wall * 1000 / requests, "ms")
    rounds.record(f"{name} {label} client CPU/request", cpu * 1000 / requests, "ms")
    rounds.record(f"{name} {label} connections", opened)


async def main_async(args: argparse.Namespace) -> None:
    names = [name for name in args.clients.split(",") if name]
    unknown = set(names) - set(CLIENTS)
    if unknown:
        raise SystemExit(f"unknown clients: {', '.join(sorted(unknown))}; known: {', '.join(CLIENTS)}")
    command = [sys.executable, __file__, "--serve", "1", "--delay", str(args.delay)]
    server = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert server.stdout is not None and server.stdin is not None
    try:
        port = int(await asyncio.wait_for(server.stdout.readline(), 30))
        rounds = Rounds("http_pool", count=args.rounds)
        for index in rounds:
            for name in rounds.order(names, index):
                await measure(rounds, name, port, 1, args.sequential, "c=1")
                await measure(rounds, name, port, args.concurrent, args.requests, f"c={args.concurrent}")
        concurrent = f"c={args.concurrent}"
        for name in names:
            if name not in ("pool", "model-client"):  # the model client runs over the pool: no contender
                for figure in ("wall", "client CPU"):
                    rounds.ratio(
                        f"pool / {name} {concurrent} {figure}",
                        f"pool {concurrent} {figure}/request",
                        f"{name} {concurrent} {figure}/request",
                    )
        rounds.report()
    finally:
        server.stdin.close()
        await server.wait()


def main() -> None:
    args = arguments(
        __doc__, rounds=5, sequential=100, concurrent=200, requests=300, delay=0.0, clients=",".join(CLIENTS), serve=0
    )
    asyncio.run(serve(args.delay) if args.serve else main_async(args))


if __name__ == "__main__":
    main()
