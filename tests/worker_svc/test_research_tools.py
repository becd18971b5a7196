"""A research run through the real tools: scratchpad service over gRPC, fixture web, scripted model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from quarry.agent.conversation import ConversationStore, metadata
from quarry.agent.loop import AgentRun, LoopLimits
from quarry.agent.messages import system, user
from quarry.agent.model import ModelClient, ModelSettings
from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import QuarrySettings, ScratchpadSettings
from quarry.db import Database
from quarry.identity import Principal, Role
from quarry.research_plane import ResearchPlane
from quarry.v1 import common_pb2, scratchpad_pb2
from scratchpad_svc.service import build_host
from tests.fakes.openai_server import Call, Reply, ScriptedModel
from tests.fakes.web_server import FixtureWeb
from worker_svc.capabilities import Capability
from worker_svc.tools import DelegationContext, tools_for
from worker_svc.web.fetch import AddressPolicy, guarded_client
from worker_svc.web.pages import PageReader
from worker_svc.web.search import SearxngBackend

SUPERVISOR = common_pb2.Principal(principal_id="supervisor", role=common_pb2.ROLE_SUPERVISOR)


@dataclass
class Bench:
    model: ScriptedModel
    site: FixtureWeb
    scratchpad: ScratchpadClient
    thread_id: str
    context: DelegationContext
    run: AgentRun[DelegationContext]


@pytest.fixture
async def bench(tmp_path: Path, model: ScriptedModel, site: FixtureWeb) -> AsyncIterator[Bench]:
    host = await build_host(
        ScratchpadSettings(address="127.0.0.1:0", database_url=f"sqlite:///{tmp_path / 'scratchpad.db'}"),
        QuarrySettings(data_dir=tmp_path),
    )
    database = Database(f"sqlite:///{tmp_path / 'worker.db'}")
    metadata.create_all(database.engine)
    store = ConversationStore(database)
    async with (
        host,
        insecure_channel(host.address) as channel,
        guarded_client(AddressPolicy(allow=(f"127.0.0.1:{site.port}",))) as web,
        httpx.AsyncClient() as plain,
    ):
        scratchpad = ScratchpadClient(channel)
        thread = await scratchpad.create_thread(title="eiffel")
        await scratchpad.append(
            thread.thread_id,
            kind=scratchpad_pb2.ENTRY_KIND_SEED,
            author=SUPERVISOR,
            content="Find the height of the Eiffel Tower.",
        )
        context = DelegationContext(
            scratchpad=ResearchPlane(scratchpad),
            scratchpad_thread_id=thread.thread_id,
            author=Principal("run-1:call-a", Role.RESEARCHER),
            search=SearxngBackend(plain, site.base_url),
            pages=PageReader(web),
        )
        await store.create("conv")
        await store.append("conv", [system("You research."), user("Find the height of the Eiffel Tower.")])
        client = ModelClient(ModelSettings(base_url=model.base_url, model="scripted", retry_budget=5))
        run = AgentRun(client, tools_for([Capability.WEB_SEARCH, Capability.SCRATCHPAD]), store, "conv", LoopLimits())
        yield Bench(model, site, scratchpad, thread.thread_id, context, run)
        await client.close()
    await database.close()


def tool_results(request: dict[str, object]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in request["messages"] if m["role"] == "tool"}  # type: ignore[attr-defined,index]


async def test_a_finding_lands_only_with_a_verified_quote(bench: Bench) -> None:
    article = f"{bench.site.base_url}/article.html"

    def finding(excerpt: str) -> dict[str, object]:
        return {
            "kind": "finding",
            "content": "The Eiffel Tower is 330 m tall.",
            "sources": [{"url": article, "title": "The Eiffel Tower", "excerpt": excerpt}],
        }

    bench.model.script(
        Reply(calls=(Call("read_scratchpad", {}, "c1"), Call("perform_web_search", {"query": "eiffel tower"}, "c2"))),
        Reply(calls=(Call("append_scratchpad", finding("The tower is 330 metres tall"), "c3"),)),
        Reply(calls=(Call("read_web_page", {"url": article}, "c4"),)),
        Reply(calls=(Call("append_scratchpad", finding("The tower is 300 metres tall"), "c5"),)),
        Reply(calls=(Call("append_scratchpad", finding("the tower is 330 METRES tall"), "c6"),)),
        Reply(content="The Eiffel Tower is 330 m tall (entry 2)."),
    )
    answer = await bench.run.run(bench.context)
    assert answer == "The Eiffel Tower is 330 m tall (entry 2)."

    first = tool_results(bench.model.requests[1])
    assert "Find the height of the Eiffel Tower." in first["c1"]
    assert article in first["c2"]
    assert "was not read in this task" in tool_results(bench.model.requests[2])["c3"]
    assert "page 1 of" in tool_results(bench.model.requests[3])["c4"]
    assert "does not occur" in tool_results(bench.model.requests[4])["c5"]
    assert tool_results(bench.model.requests[5])["c6"] == "appended as entry 2"

    entries = await bench.scratchpad.read_all(bench.thread_id)
    assert [(e.sequence_no, e.kind) for e in entries] == [
        (1, scratchpad_pb2.ENTRY_KIND_SEED),
        (2, scratchpad_pb2.ENTRY_KIND_FINDING),
    ]
    assert entries[1].author.principal_id == "run-1:call-a"
    assert entries[1].sources[0].excerpt == "the tower is 330 METRES tall"
    assert bench.context.promoted == [2]


async def test_authority_refusals_reach_the_model(bench: Bench) -> None:
    bench.model.script(
        Reply(calls=(Call("append_scratchpad", {"kind": "seed", "content": "a plan of my own"}, "c1"),)),
        Reply(content="understood"),
    )
    await bench.run.run(bench.context)
    result = tool_results(bench.model.requests[1])["c1"]
    assert "may not write ENTRY_KIND_SEED" in result
    assert [e.sequence_no for e in await bench.scratchpad.read_all(bench.thread_id)] == [1]


async def test_a_repeated_append_is_promoted_once(bench: Bench) -> None:
    note = {"kind": "note", "content": "Checked the seed."}
    bench.model.script(
        Reply(calls=(Call("append_scratchpad", note, "c1"), Call("append_scratchpad", note, "c2"))),
        Reply(content="done"),
    )
    await bench.run.run(bench.context)
    assert json.dumps(tool_results(bench.model.requests[1])) == json.dumps(
        {"c1": "appended as entry 2", "c2": "appended as entry 2"}
    )
    assert [e.sequence_no for e in await bench.scratchpad.read_all(bench.thread_id)] == [1, 2]
    assert bench.context.promoted == [2]
