"""The model client over real HTTP against each server family's stream, quirks included (see streams.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from quarry.agent.messages import system, user
from quarry.agent.model import ModelClient, ModelSettings, ProviderError
from quarry.agent.usage import Usage
from quarry.config import QuarrySettings, SupervisorSettings, WorkerSettings
from tests.fakes.replay_server import Answer, Drop, ReplayServer
from tests.quarry.agent import streams

HISTORY = [system("You research."), user("How tall is the Eiffel Tower?")]


@pytest.fixture
async def server() -> AsyncIterator[ReplayServer]:
    async with ReplayServer() as replay:
        yield replay


@pytest.fixture
async def client(server: ReplayServer) -> AsyncIterator[ModelClient]:
    model = ModelClient(ModelSettings(base_url=server.base_url, model="m", retry_budget=10.0))
    yield model
    await model.close()


def custom_client(server: ReplayServer, **overrides: object) -> ModelClient:
    settings = {"base_url": server.base_url, "model": "m", "retry_budget": 10.0, **overrides}
    return ModelClient(ModelSettings(**settings))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "family",
    [
        streams.OPENAI,
        streams.AZURE,
        streams.OPENROUTER,
        streams.DEEPSEEK,
        streams.VLLM_NO_FINISH,
        streams.HEARTBEATS,
    ],
    ids=["openai", "azure", "openrouter", "deepseek", "vllm-no-finish-reason", "empty-data-heartbeats"],
)
async def test_each_familys_text_stream_is_one_answer(
    server: ReplayServer, client: ModelClient, family: tuple[bytes, ...]
) -> None:
    server.script(Answer(family))
    pieces: list[str] = []
    reply = await client.complete(HISTORY, call_id_prefix="t1", on_text=pieces.append)
    assert reply.message.content == streams.ANSWER == "".join(pieces)
    assert reply.finish_reason == "stop"
    assert reply.usage == Usage(20, 6) and not reply.usage_estimated


async def test_three_turns_share_one_connection(server: ReplayServer, client: ModelClient) -> None:
    """The stream is read to its end, past [DONE], so its connection goes back to the pool."""
    server.script(*[Answer(streams.OPENAI)] * 3)
    for turn in range(3):
        assert (await client.complete(HISTORY, call_id_prefix=f"t{turn}")).message.content == streams.ANSWER
    assert server.connections == 1


@pytest.mark.parametrize("index", [0, None], ids=["all-index-0", "no-index"])
async def test_ollamas_parallel_calls_stay_apart(server: ReplayServer, client: ModelClient, index: int | None) -> None:
    server.script(Answer(streams.ollama_parallel_calls(index)))
    reply = await client.complete(HISTORY, call_id_prefix="t1")
    assert [(c.id, c.name, json.loads(c.arguments)) for c in reply.message.tool_calls] == [
        ("call_a1", "perform_web_search", streams.SEARCH),
        ("call_b2", "fetch_page", streams.FETCH),
    ]
    assert reply.finish_reason == "tool_calls"


async def test_a_name_resent_in_every_delta_is_kept_once(server: ReplayServer, client: ModelClient) -> None:
    server.script(Answer(streams.NIM_REPEATED_NAME))
    reply = await client.complete(HISTORY, call_id_prefix="t1")
    assert [(c.id, c.name, json.loads(c.arguments)) for c in reply.message.tool_calls] == [
        ("call_n1", "perform_web_search", streams.SEARCH)
    ]


async def test_a_request_dropped_before_any_response_is_sent_again(server: ReplayServer, client: ModelClient) -> None:
    server.script(Drop(), Answer(streams.OPENAI))
    reply = await client.complete(HISTORY, call_id_prefix="t1")
    assert reply.message.content == streams.ANSWER
    assert len(server.requests) == 2 and server.connections == 2


async def test_dropped_requests_are_retried_only_within_the_attempts(server: ReplayServer) -> None:
    server.script(Drop(), Drop(), Answer(streams.OPENAI))
    limited = custom_client(server, max_attempts=2)
    with pytest.raises(ProviderError, match="Server disconnected without sending a response"):
        await limited.complete(HISTORY, call_id_prefix="t1")
    await limited.close()
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("family", "message"),
    [
        ((streams.OPENAI[0], streams.LLAMA_CPP_CONTEXT_ERROR), "exceeds the available context size"),
        (streams.OPENROUTER_ERROR, "Provider disconnected"),
    ],
    ids=["llama.cpp-error-field", "openrouter-error-chunk"],
)
async def test_an_error_in_the_stream_fails_with_the_servers_message(
    server: ReplayServer, client: ModelClient, family: tuple[bytes, ...], message: str
) -> None:
    server.script(Answer(family))
    with pytest.raises(ProviderError, match=message) as failure:
        await client.complete(HISTORY, call_id_prefix="t1")
    assert server.base_url in str(failure.value)


async def test_a_stream_ending_without_done_or_finish_reason_fails(server: ReplayServer, client: ModelClient) -> None:
    server.script(Answer(streams.TRUNCATED))
    with pytest.raises(ProviderError, match="ended without a finish reason"):
        await client.complete(HISTORY, call_id_prefix="t1")


async def test_keep_alive_comments_do_not_extend_the_request_past_its_deadline(server: ReplayServer) -> None:
    """DeepSeek's keep-alives arrive well within the idle limit, but the request as a whole has a deadline."""
    server.script(Answer((streams.DEEPSEEK_KEEP_ALIVE,) * 40 + streams.OPENAI, pause=0.05))
    deadline = custom_client(server, request_timeout=0.5, idle_timeout=10.0)
    with pytest.raises(ProviderError, match=r"did not finish within 0\.5 s") as failure:
        await deadline.complete(HISTORY, call_id_prefix="t1")
    await deadline.close()
    assert "QUARRY_MODEL_REQUEST_TIMEOUT allows longer" in str(failure.value)


async def test_silence_past_the_idle_limit_fails_naming_its_setting(server: ReplayServer) -> None:
    server.script(Answer(streams.OPENAI, pause=2.0))
    idle = custom_client(server, request_timeout=30.0, idle_timeout=0.2)
    with pytest.raises(ProviderError, match=r"sent nothing for 0\.2 s") as failure:
        await idle.complete(HISTORY, call_id_prefix="t1")
    await idle.close()
    assert "QUARRY_MODEL_IDLE_TIMEOUT allows longer silence" in str(failure.value)


async def test_a_whole_json_answer_to_a_stream_request_is_read_as_the_reply(
    server: ReplayServer, client: ModelClient
) -> None:
    server.script(Answer((streams.WHOLE_COMPLETION,), content_type="application/json"))
    pieces: list[str] = []
    reply = await client.complete(HISTORY, call_id_prefix="t1", on_text=pieces.append)
    assert reply.message.content == streams.ANSWER == "".join(pieces)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in reply.message.tool_calls] == [
        ("call_w1", "perform_web_search", streams.SEARCH)
    ]
    assert reply.finish_reason == "tool_calls"
    assert reply.usage == Usage(31, 9) and not reply.usage_estimated
    # Whatever the content type says, a body of events is still a stream (the openai SDK reads it so too).
    server.script(Answer(streams.OPENAI, content_type="application/json"))
    reply = await client.complete(HISTORY, call_id_prefix="t2")
    assert reply.message.content == streams.ANSWER and reply.finish_reason == "stop"


async def test_a_stream_without_usage_gets_estimated_tokens(server: ReplayServer, client: ModelClient) -> None:
    """TGI sends no usage: tokens are estimated from characters (about four a token), and marked so."""
    server.script(Answer(streams.TGI_NO_USAGE))
    reply = await client.complete(HISTORY, call_id_prefix="t1")
    assert reply.message.content == streams.ANSWER
    assert reply.usage_estimated
    prompt_chars = len(json.dumps(server.requests[0], ensure_ascii=False))
    # The request as sent, in the client's own spelling, is within a few characters of what arrived.
    assert abs(reply.usage.input_tokens - prompt_chars / 4) <= prompt_chars / 40
    assert reply.usage.output_tokens == -(-len(streams.ANSWER) // 4)


def test_the_idle_limit_is_set_per_tier_or_for_every_tier() -> None:
    common = QuarrySettings(model_idle_timeout=7.0)
    assert ModelSettings.for_tier(WorkerSettings(model_idle_timeout=5.0), common).idle_timeout == 5.0
    assert ModelSettings.for_tier(SupervisorSettings(), common).idle_timeout == 7.0
