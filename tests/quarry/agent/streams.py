"""What each OpenAI-compatible server family sends for a chat completion, byte for byte.

Written from each family's documented format (cited at each fixture), not captured from a live server:
the shapes a client meets, quirks included. Each fixture is the parts of one response body, in order.
"""

from __future__ import annotations

import json
from typing import Any

# The answer and the calls every fixture carries, so the tests can say what the client must make of it.
ANSWER = "The tower is 330 m tall."
SEARCH = {"query": "eiffel tower height"}
FETCH = {"url": "https://example.org/eiffel"}


def data(payload: dict[str, Any], prefix: str = "data: ") -> bytes:
    return f"{prefix}{json.dumps(payload)}\n\n".encode()


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [choice],
        **extra,
    }


def usage(prompt: int = 20, completion: int = 6) -> dict[str, Any]:
    counts = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {**chunk({}), "choices": [], "usage": counts}


DONE = b"data: [DONE]\n\n"

# OpenAI's chat-completions streaming reference: a role chunk, content deltas, a finish chunk, and with
# stream_options.include_usage a last chunk with empty choices and the usage; then [DONE].
OPENAI = (
    data(chunk({"role": "assistant", "content": ""})),
    data(chunk({"content": ANSWER[:12]})),
    data(chunk({"content": ANSWER[12:]})),
    data(chunk({}, "stop")),
    data(usage()),
    DONE,
)

# Azure OpenAI: the first chunk has empty choices and the prompt's content-filter results
# (prompt_filter_results); each later choice carries content_filter_results (Azure OpenAI content
# filtering docs, "streaming").
_FILTERED = {"hate": {"filtered": False, "severity": "safe"}, "violence": {"filtered": False, "severity": "safe"}}
AZURE = (
    data(
        {
            "choices": [],
            "created": 0,
            "id": "",
            "model": "",
            "object": "",
            "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": _FILTERED}],
        }
    ),
    data(
        {
            **chunk({"role": "assistant", "content": ANSWER}),
            "choices": [
                {"index": 0, "delta": {"content": ANSWER}, "finish_reason": None, "content_filter_results": _FILTERED}
            ],
        }
    ),
    data(chunk({}, "stop")),
    data(usage()),
    DONE,
)

# OpenRouter: SSE comments `: OPENROUTER PROCESSING` while the request waits for a provider (OpenRouter
# API docs, "Streaming": comments may be sent to prevent connection timeouts).
OPENROUTER = (b": OPENROUTER PROCESSING\n\n", b": OPENROUTER PROCESSING\n\n", *OPENAI)

# OpenRouter reports an error that happens mid-stream as a chunk with a top-level `error` and
# finish_reason "error" (OpenRouter API docs, "Streaming", error handling).
OPENROUTER_ERROR = (
    data(chunk({"role": "assistant", "content": "The tower"})),
    data({**chunk({"content": ""}, "error"), "error": {"code": "server_error", "message": "Provider disconnected"}}),
    DONE,
)

# DeepSeek: while a request waits to be scheduled, a stream gets `: keep-alive` comments, for up to
# 30 minutes (DeepSeek API docs, "Rate limit": "streaming requests: continuously return SSE keep-alive comments").
DEEPSEEK_KEEP_ALIVE = b": keep-alive\n\n"
DEEPSEEK = (DEEPSEEK_KEEP_ALIVE, DEEPSEEK_KEEP_ALIVE, *OPENAI)

# vLLM's OpenAI-compatible server: a stream that ends with [DONE] but without any finish_reason is seen
# now and then (vLLM issues on streaming with tool parsers and aborted requests); the reply is whole.
VLLM_NO_FINISH = (
    data(chunk({"role": "assistant", "content": ""})),
    data(chunk({"content": ANSWER})),
    data(usage()),
    DONE,
)

# A stream that ends cleanly without [DONE] and without a finish_reason: the server never said the
# reply was whole, so it is a failure however it ends.
TRUNCATED = (data(chunk({"role": "assistant", "content": ""})), data(chunk({"content": ANSWER[:12]})))


# Ollama's OpenAI compatibility (docs/openai.md, streaming tool calls): each parallel call arrives whole
# in a chunk of its own, each with index 0 and an id of its own; some versions send no index at all.
def _ollama_call(call_id: str, name: str, arguments: dict[str, Any], index: int | None) -> bytes:
    call: dict[str, Any] = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    if index is not None:
        call["index"] = index
    return data(chunk({"role": "assistant", "content": "", "tool_calls": [call]}, system_fingerprint="fp_ollama"))


def ollama_parallel_calls(index: int | None) -> tuple[bytes, ...]:
    return (
        _ollama_call("call_a1", "perform_web_search", SEARCH, index),
        _ollama_call("call_b2", "fetch_page", FETCH, index),
        data(chunk({"role": "assistant", "content": ""}, "tool_calls", system_fingerprint="fp_ollama")),
        data(usage()),
        DONE,
    )


# llama.cpp server (tools/server/README.md): a failure during a stream, e.g. a prompt over the context
# size, is sent as an SSE field named `error`, not as a `data:` event.
LLAMA_CPP_CONTEXT_ERROR = (
    "error: "
    + json.dumps(
        {
            "error": {
                "code": 400,
                "message": "request (4476 tokens) exceeds the available context size (4096 tokens)",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 4476,
                "n_ctx": 4096,
            }
        }
    )
    + "\n\n"
).encode()


# NVIDIA NIM and some Fireworks deployments resend the whole function name in every delta of one call
# (NIM LLM API reference, streamed tool calls; Fireworks function-calling docs); arguments arrive in pieces.
def _named_delta(arguments: str) -> dict[str, Any]:
    call = {
        "index": 0,
        "id": "call_n1",
        "type": "function",
        "function": {"name": "perform_web_search", "arguments": arguments},
    }
    return chunk({"tool_calls": [call]})


_SEARCH_JSON = json.dumps(SEARCH)
NIM_REPEATED_NAME = (
    data(chunk({"role": "assistant", "content": None})),
    data(_named_delta("")),
    data(_named_delta(_SEARCH_JSON[:10])),
    data(_named_delta(_SEARCH_JSON[10:])),
    data(chunk({}, "tool_calls")),
    data(usage()),
    DONE,
)

# Hugging Face TGI's Messages API: `data:` events of chat.completion.chunk objects with "usage": null in
# each, and usage only when asked for it in a way it does not always honour (TGI docs, "Messages API").
# Here it sends none: the client must estimate.
TGI_NO_USAGE = (
    data({**chunk({"role": "assistant", "content": ANSWER[:12]}), "usage": None, "system_fingerprint": "3.0.0-native"}),
    data({**chunk({"role": "assistant", "content": ANSWER[12:]}, "stop"), "usage": None}),
    DONE,
)

# Heartbeats as empty `data:` fields (some gateways send them; the SSE spec dispatches them as events
# with empty data, which carry nothing), in both spellings: `data:` and `data: ` then a blank line.
HEARTBEATS = (b"data:\n\n", b"data: \n\n", *OPENAI[:3], b"data:\n\n", *OPENAI[3:])

# A server that ignores `stream: true` and answers with the whole chat.completion as JSON.
WHOLE_COMPLETION = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": ANSWER,
                    "tool_calls": [
                        {
                            "id": "call_w1",
                            "type": "function",
                            "function": {"name": "perform_web_search", "arguments": _SEARCH_JSON},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40},
    }
).encode()
