"""Keep-alive connections to the model endpoint (quarry.agent.pool), counted on a real local server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from quarry.agent.messages import system, user
from quarry.agent.model import ModelClient, ModelSettings
from quarry.agent.pool import KeepAlivePool, PooledTransport, environment_proxy
from tests.fakes.replay_server import Answer, Drop, ReplayServer
from tests.quarry.agent import streams

HISTORY = [system("You research."), user("How tall is the Eiffel Tower?")]
# An answer in two parts, `pause` apart: long enough that concurrent requests overlap.
SLOW = Answer(streams.OPENAI, pause=0.2)


@pytest.fixture
async def server() -> AsyncIterator[ReplayServer]:
    async with ReplayServer() as replay:
        yield replay


def pooled(
    max_connections: int = 100, keepalive_expiry: float = 5.0, **timeouts: float
) -> tuple[httpx.AsyncClient, KeepAlivePool]:
    """An httpx client over the pool, and the pool (to count what it opened and holds)."""
    transport = PooledTransport(httpx.Limits(max_connections=max_connections, keepalive_expiry=keepalive_expiry))
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(10.0, **timeouts)), transport.pool


async def post(client: httpx.AsyncClient, server: ReplayServer) -> str:
    response = await client.post(f"{server.base_url}/chat/completions", json={"stream": True})
    return response.text


async def until(condition: Callable[[], bool]) -> None:
    """Wait for what the server sees to catch up (a close crosses the loopback), for a second at most."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server never saw it")


async def test_sequential_requests_share_one_connection(server: ReplayServer) -> None:
    server.script(*[Answer(streams.OPENAI)] * 3)
    client, pool = pooled()
    async with client:
        for _ in range(3):
            assert "[DONE]" in await post(client, server)
        assert pool.opened == 1
    assert server.connections == 1


async def test_model_client_turns_share_one_connection_from_this_pool(server: ReplayServer) -> None:
    server.script(*[Answer(streams.OPENAI)] * 3)
    model = ModelClient(ModelSettings(base_url=server.base_url, model="m"))
    for turn in range(3):
        assert (await model.complete(HISTORY, call_id_prefix=f"t{turn}")).message.content == streams.ANSWER
    assert isinstance(model._transport, PooledTransport) and model._transport.pool.opened == 1
    await model.close()
    assert server.connections == 1


async def test_concurrent_requests_each_get_a_connection_and_return_it(server: ReplayServer) -> None:
    server.script(*[SLOW] * 20)
    client, pool = pooled()
    async with client:
        await asyncio.gather(*(post(client, server) for _ in range(10)))
        assert server.connections == 10 and pool.open_connections == 10
        await asyncio.gather(*(post(client, server) for _ in range(10)))  # the same ten, back from the first
        assert server.connections == 10 and pool.opened == 10


async def test_the_pool_is_bounded_and_requests_beyond_it_wait(server: ReplayServer) -> None:
    server.script(*[SLOW] * 5)
    client, pool = pooled(max_connections=2)
    async with client:
        texts = await asyncio.gather(*(post(client, server) for _ in range(5)))
        assert all("[DONE]" in text for text in texts)
        assert pool.opened == 2
    assert server.connections == 2


async def test_at_the_bound_an_idle_connection_to_another_origin_makes_room(server: ReplayServer) -> None:
    server.script(Answer(streams.OPENAI))
    async with ReplayServer() as other:
        other.script(Answer(streams.OPENAI))
        client, pool = pooled(max_connections=1)
        async with client:
            assert "[DONE]" in await post(client, server)
            assert "[DONE]" in await post(client, other)
            await until(lambda: server.closed == 1)  # closed by us, to stay within the bound
            assert pool.open_connections == 1 and pool.opened == 2


async def test_a_request_waits_no_longer_than_the_pool_timeout(server: ReplayServer) -> None:
    server.script(Answer(streams.OPENAI, pause=1.0), Answer(streams.OPENAI))
    client, _ = pooled(max_connections=1, pool=0.1)
    async with client:
        holder = asyncio.ensure_future(post(client, server))
        await until(lambda: len(server.requests) == 1)
        with pytest.raises(httpx.PoolTimeout):
            await post(client, server)
        assert "[DONE]" in await holder
        assert "[DONE]" in await post(client, server)  # the slot the timed-out request waited for is free again


async def test_a_connection_the_server_closed_while_idle_does_not_fail_the_next_call(server: ReplayServer) -> None:
    """One attempt only: the dead connection is left, not tried and retried."""
    server.script(Answer(streams.OPENAI, close=True), Answer(streams.OPENAI))
    model = ModelClient(ModelSettings(base_url=server.base_url, model="m", max_attempts=1))
    assert (await model.complete(HISTORY, call_id_prefix="t1")).message.content == streams.ANSWER
    await until(lambda: server.closed == 1)
    assert (await model.complete(HISTORY, call_id_prefix="t2")).message.content == streams.ANSWER
    await model.close()
    assert len(server.requests) == 2 and server.connections == 2


async def test_an_expired_keep_alive_is_closed_not_reused(server: ReplayServer) -> None:
    server.script(Answer(streams.OPENAI), Answer(streams.OPENAI))
    client, pool = pooled(keepalive_expiry=0.05)
    async with client:
        await post(client, server)
        await asyncio.sleep(0.1)
        await post(client, server)
        await until(lambda: server.closed == 1)  # the expired one, closed by us
        assert pool.open_connections == 1
    assert server.connections == 2


async def test_a_response_closed_unread_drops_its_connection(server: ReplayServer) -> None:
    server.script(SLOW, Answer(streams.OPENAI))
    client, pool = pooled()
    async with client:
        async with client.stream("POST", f"{server.base_url}/chat/completions", json={}) as response:
            assert response.status_code == 200  # then closed with the rest of the body unread
        assert pool.open_connections == 0
        assert "[DONE]" in await post(client, server)
    assert server.connections == 2


async def test_closing_the_client_closes_its_connections(server: ReplayServer) -> None:
    server.script(*[SLOW] * 3)
    model = ModelClient(ModelSettings(base_url=server.base_url, model="m"))
    await asyncio.gather(*(model.complete(HISTORY, call_id_prefix=f"t{n}") for n in range(3)))
    assert server.connections == 3 and server.closed == 0
    await model.close()
    await until(lambda: server.closed == 3)


async def test_transport_failures_keep_httpx_exception_types(server: ReplayServer) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{unused.getsockname()[1]}/"
        server.script(Drop(), Answer(streams.OPENAI, pause=1.0))
        client, pool = pooled(read=0.1)
        async with client:
            with pytest.raises(httpx.ConnectError):
                await client.get(refused)
            with pytest.raises(httpx.RemoteProtocolError, match="Server disconnected"):
                await post(client, server)
            with pytest.raises(httpx.ReadTimeout):
                await post(client, server)
            assert pool.open_connections == 0


def test_a_proxy_in_the_environment_leaves_routing_to_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert not environment_proxy()
    assert isinstance(
        ModelClient(ModelSettings(base_url="http://127.0.0.1:9/v1", model="m"))._transport, PooledTransport
    )
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    assert environment_proxy()
    assert ModelClient(ModelSettings(base_url="http://127.0.0.1:9/v1", model="m"))._transport is None


def test_a_pool_without_a_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a bound"):
        PooledTransport(httpx.Limits(max_connections=None))
