"""The model client over real HTTP against the scripted OpenAI-compatible server."""

from __future__ import annotations

import json

import pytest

from quarry.agent.messages import system, user
from quarry.agent.model import ModelClient, ModelSettings, ProviderError, v1_hint
from quarry.agent.usage import Usage
from quarry.config import ModelTier, QuarrySettings, SupervisorSettings, WorkerSettings
from tests.conftest import reusable_port
from tests.fakes.openai_server import (
    Call,
    DropAfter,
    EndWithout,
    ErrorEvent,
    HttpError,
    Reply,
    ScriptedModel,
    Stall,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "perform_web_search",
            "description": "search",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
]
HISTORY = [system("You research."), user("How tall is the Eiffel Tower?")]


def client(model: ScriptedModel, **overrides: object) -> ModelClient:
    settings = {"base_url": model.base_url, "model": "scripted", "retry_budget": 10.0, **overrides}
    return ModelClient(ModelSettings(**settings))  # type: ignore[arg-type]


async def test_streamed_text_and_parallel_native_tool_calls(model: ScriptedModel) -> None:
    model.script(
        Reply(
            content="Searching two ways.",
            calls=(
                Call("perform_web_search", {"query": "eiffel"}, "c1"),
                Call("perform_web_search", {"query": "tower"}, "c2"),
            ),
            input_tokens=42,
            output_tokens=7,
        )
    )
    pieces: list[str] = []
    reply = await client(model).complete(HISTORY, TOOLS, call_id_prefix="t1", on_text=pieces.append)
    assert reply.message.content == "Searching two ways." == "".join(pieces)
    assert len(pieces) > 1, "text arrives as it streams"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in reply.message.tool_calls] == [
        ("c1", "perform_web_search", {"query": "eiffel"}),
        ("c2", "perform_web_search", {"query": "tower"}),
    ]
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (42, 7)
    assert reply.finish_reason == "tool_calls"
    sent = model.requests[0]
    assert sent["tools"] == TOOLS and sent["stream"] is True
    assert [m["role"] for m in sent["messages"]] == ["system", "user"]


async def test_429_and_5xx_are_retried_honouring_retry_after(model: ScriptedModel) -> None:
    model.script(HttpError(429, retry_after="1"), HttpError(503), Reply(content="fine"))
    reply = await client(model).complete(HISTORY, call_id_prefix="t1")
    assert reply.message.content == "fine"
    assert len(model.requests) == 3
    # The scripted server measures it, not the test's clock: the second request waited for Retry-After.
    assert model.request_times[1] - model.request_times[0] >= 0.95


async def test_a_malformed_retry_after_falls_back_to_backoff(model: ScriptedModel) -> None:
    model.script(HttpError(429, retry_after="soon"), HttpError(503, retry_after="nan"), Reply(content="fine"))
    assert (await client(model).complete(HISTORY, call_id_prefix="t1")).message.content == "fine"
    assert len(model.requests) == 3


async def test_retries_are_bounded_by_attempts(model: ScriptedModel) -> None:
    model.script(*[HttpError(500)] * 5)
    with pytest.raises(ProviderError, match="HTTP 500"):
        await client(model, max_attempts=3).complete(HISTORY, call_id_prefix="t1")
    assert len(model.requests) == 3


async def test_a_retry_after_beyond_the_budget_is_not_waited_for(model: ScriptedModel) -> None:
    model.script(HttpError(429, retry_after="3600"), Reply(content="too late"))
    with pytest.raises(ProviderError, match="retry budget"):
        await client(model).complete(HISTORY, call_id_prefix="t1")
    assert len(model.requests) == 1


async def test_other_client_errors_are_not_retried(model: ScriptedModel) -> None:
    model.script(HttpError(400, message="bad request"), Reply(content="unused"))
    with pytest.raises(ProviderError, match="HTTP 400"):
        await client(model).complete(HISTORY, call_id_prefix="t1")
    assert len(model.requests) == 1


async def test_an_error_the_stream_reports_fails_with_the_providers_message(model: ScriptedModel) -> None:
    model.script(ErrorEvent("the model is overloaded"), Reply(content="would be a retry"))
    pieces: list[str] = []
    with pytest.raises(ProviderError, match="the model is overloaded") as failure:
        await client(model).complete(HISTORY, call_id_prefix="t1", on_text=pieces.append)
    assert model.base_url in str(failure.value)
    assert pieces == [] and len(model.requests) == 1


async def test_a_stream_broken_after_text_fails_and_is_not_retried(model: ScriptedModel) -> None:
    model.script(DropAfter("The tower is 3"), Reply(content="would be a retry"))
    pieces: list[str] = []
    with pytest.raises(ProviderError):
        await client(model).complete(HISTORY, call_id_prefix="t1", on_text=pieces.append)
    assert "".join(pieces) == "The tower is 3"
    assert len(model.requests) == 1


async def test_a_stream_that_ends_cleanly_without_a_finish_reason_is_incomplete_not_an_answer(
    model: ScriptedModel,
) -> None:
    """The response ends properly (no cut connection) after partial text, but with neither a finish_reason
    nor [DONE]: the provider never said the answer was complete, so it is a failure, not a short answer."""
    model.script(EndWithout("The tower is 3"), Reply(content="would be a retry"))
    pieces: list[str] = []
    with pytest.raises(ProviderError, match="ended without a finish reason") as failure:
        await client(model).complete(HISTORY, TOOLS, call_id_prefix="t1", on_text=pieces.append)
    assert model.base_url in str(failure.value)
    assert "".join(pieces) == "The tower is 3"
    assert len(model.requests) == 1  # text was already shown: never retried


async def test_a_stall_past_the_request_timeout_fails(model: ScriptedModel) -> None:
    model.script(Stall(30))
    with pytest.raises(ProviderError, match="Timeout"):
        await client(model, request_timeout=0.5).complete(HISTORY, call_id_prefix="t1")


@pytest.mark.parametrize("tier", [WorkerSettings, SupervisorSettings])
async def test_an_unreachable_endpoint_names_its_url_and_the_settings_that_choose_it(tier: type[ModelTier]) -> None:
    url = f"http://127.0.0.1:{reusable_port()}/v1"  # nothing listens there
    settings = ModelSettings.for_tier(tier(), QuarrySettings(model_base_url=url))
    unreachable = ModelClient(settings)
    with pytest.raises(ProviderError) as failure:
        await unreachable.complete(HISTORY, call_id_prefix="t1")
    await unreachable.close()
    prefix = tier.model_config.get("env_prefix")
    assert f"cannot reach {url}" in str(failure.value)
    assert f"set {prefix}MODEL_BASE_URL (or QUARRY_MODEL_BASE_URL for every tier)" in str(failure.value)


@pytest.mark.parametrize(("status", "setting"), [(401, "QUARRY_MODEL_API_KEY"), (404, "QUARRY_MODEL_NAME")])
async def test_a_refusal_names_the_endpoint_and_the_setting_to_check(
    model: ScriptedModel, status: int, setting: str
) -> None:
    model.script(HttpError(status))
    with pytest.raises(ProviderError) as failure:
        await client(model).complete(HISTORY, call_id_prefix="t1")
    assert f"{model.base_url} answered HTTP {status}" in str(failure.value)
    assert f"check {setting}" in str(failure.value)


async def test_a_base_url_without_v1_answering_404_asks_whether_v1_was_meant(model: ScriptedModel) -> None:
    root = model.base_url.removesuffix("/v1")  # the scripted server, like vLLM and Ollama, serves under /v1
    settings = ModelSettings.for_tier(WorkerSettings(), QuarrySettings(model_base_url=root, model_name="scripted"))
    without_v1 = ModelClient(settings)
    with pytest.raises(ProviderError) as failure:
        await without_v1.complete(HISTORY, call_id_prefix="t1")
    await without_v1.close()
    assert f"{root} answered HTTP 404" in str(failure.value)
    assert f"did you mean {root}/v1? check QUARRY_WORKER_MODEL_NAME" in str(failure.value)
    assert model.requests == []
    assert v1_hint(model.base_url) == "" and v1_hint("http://gpu-box:8000/") == "did you mean http://gpu-box:8000/v1?"
    assert v1_hint("https://api.example.com/openai") == "", "a path of its own is the deployment's choice"


async def test_text_protocol_for_models_without_native_tools(model: ScriptedModel) -> None:
    block = '<tool_call>{"name": "perform_web_search", "arguments": {"query": "eiffel"}}</tool_call>'
    model.script(Reply(content=f"Let me look.\n{block}"))
    reply = await client(model, native_tools=False).complete(HISTORY, TOOLS, call_id_prefix="t4")
    assert [(c.id, c.name) for c in reply.message.tool_calls] == [("t4-1", "perform_web_search")]
    sent = model.requests[0]
    assert "tools" not in sent
    assert "<tool_call>" in sent["messages"][0]["content"], "the tools are taught in the system prompt"


async def test_text_protocol_tool_blocks_never_reach_the_text_listener(model: ScriptedModel) -> None:
    block = '<tool_call>{"name": "perform_web_search", "arguments": {"query": "eiffel"}}</tool_call>'
    model.script(Reply(content=f"Let me look.\n{block}", chunks=6), Reply(content="A plain answer.", chunks=4))
    pieces: list[str] = []
    text_client = client(model, native_tools=False)
    await text_client.complete(HISTORY, TOOLS, call_id_prefix="t5", on_text=pieces.append)
    assert pieces == ["Let me look."], "with tools, only the parsed prose is passed on"
    pieces.clear()
    await text_client.complete(HISTORY, (), call_id_prefix="t6", on_text=pieces.append)
    assert "".join(pieces) == "A plain answer." and len(pieces) > 1, "without tools, text streams as it comes"


async def test_a_failing_text_listener_is_its_own_error_not_a_provider_failure(model: ScriptedModel) -> None:
    model.script(Reply(content="Some text."))

    def listener(text: str) -> None:
        raise LookupError("the caller's own problem")

    with pytest.raises(LookupError, match="the caller's own problem"):
        await client(model).complete(HISTORY, call_id_prefix="t7", on_text=listener)


def test_usage_adds_up_and_round_trips_through_json() -> None:
    total = Usage(10, 2, 1, 0) + Usage(30, 6, 1, 4)
    assert total == Usage(input_tokens=40, output_tokens=8, model_calls=2, tool_calls=4)
    assert total.tokens == 48
    # Read from a larger record too, as the worker stores it flat inside an outcome.
    assert Usage.from_json({**total.to_json(), "turns": 2}) == total
    assert Usage.from_json({}) == Usage()
