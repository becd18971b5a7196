"""A worker process and a scratchpad process, talking real gRPC, driven by the scripted model."""

from __future__ import annotations

from pathlib import Path

import pytest

from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.v1 import common_pb2, scratchpad_pb2, worker_pb2, worker_pb2_grpc
from tests.conftest import start_service, stop_service
from tests.fakes.choreography import append_finding
from tests.fakes.openai_server import Call, Reply, ScriptedModel
from tests.fakes.web_server import FixtureWeb

pytestmark = pytest.mark.slow


async def test_delegation_across_processes_with_ssrf_refused(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb
) -> None:
    common = {"QUARRY_DATA_DIR": str(tmp_path), "QUARRY_LOG_LEVEL": "WARNING"}
    scratchpad_process = start_service("scratchpad", common, tmp_path)
    worker_process = None
    try:
        worker_process = start_service(
            "worker",
            {
                **common,
                "QUARRY_WORKER_SCRATCHPAD_ADDRESS": scratchpad_process.address,
                "QUARRY_WORKER_MODEL_BASE_URL": model.base_url,
                "QUARRY_WORKER_MODEL_NAME": "scripted",
                "QUARRY_WORKER_SEARCH_BACKEND": "searxng",
                "QUARRY_WORKER_SEARXNG_URL": site.base_url,
                "QUARRY_WORKER_FETCH_ALLOW": f"127.0.0.1:{site.port}",
            },
            tmp_path,
        )
        article = f"{site.base_url}/article.html"
        attempts = [
            "http://127.0.0.1:9/",
            "http://10.0.0.1/admin",
            "http://169.254.169.254/latest/meta-data/",
            f"{site.base_url}/redirect?to=http%3A%2F%2F169.254.169.254%2F",
        ]
        model.script(
            Reply(calls=tuple(Call("read_web_page", {"url": url}, f"ssrf-{i}") for i, url in enumerate(attempts))),
            Reply(calls=(Call("read_web_page", {"url": article}, "ok"),)),
            Reply(
                calls=(
                    append_finding(
                        "append", "The Eiffel Tower is 330 m tall.", article, "The tower is 330 metres tall"
                    ),
                )
            ),
            Reply(content="One finding promoted."),
        )
        async with (
            insecure_channel(scratchpad_process.address) as scratchpad_channel,
            insecure_channel(worker_process.address) as worker_channel,
        ):
            scratchpad = ScratchpadClient(scratchpad_channel)
            thread = await scratchpad.create_thread(title="processes")
            request = worker_pb2.DelegateRequest(
                delegation_id="run-9:call-1",
                run_id="run-9",
                tool_call_id="call-1",
                scratchpad_thread_id=thread.thread_id,
                task=worker_pb2.ResearchTask(objective="How tall is the Eiffel Tower?"),
                role=common_pb2.ROLE_RESEARCHER,
            )
            events = [e async for e in worker_pb2_grpc.WorkerServiceStub(worker_channel).Delegate(request, timeout=60)]
            result = events[-1].result
            assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result
            assert list(result.promoted_sequence_nos) == [1]
            refusals = {m["tool_call_id"]: m["content"] for m in model.requests[1]["messages"] if m["role"] == "tool"}
            assert set(refusals) == {f"ssrf-{i}" for i in range(len(attempts))}
            assert all("not a public address" in text for text in refusals.values()), refusals
            entries = await scratchpad.read_all(thread.thread_id)
            assert [(e.kind, e.author.principal_id) for e in entries] == [
                (scratchpad_pb2.ENTRY_KIND_FINDING, "run-9:call-1")
            ]
        assert stop_service(worker_process) == 0, worker_process.log()
        assert stop_service(scratchpad_process) == 0, scratchpad_process.log()
    finally:
        for process in (worker_process, scratchpad_process):
            if process is not None:
                stop_service(process)
