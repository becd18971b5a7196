"""arXiv and Semantic Scholar as search backends, against fixture servers speaking their APIs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import QuarrySettings, ScratchpadSettings, WorkerSettings
from quarry.diagnostics import Finding, Status
from quarry.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from scratchpad_svc.service import build_host as build_scratchpad
from tests.fakes.literature_server import ARXIV_EMPTY, ATOM, ENTITY_BOMB, Canned, Literature
from tests.fakes.openai_server import Call, Reply, ScriptedModel
from worker_svc.corpus import Corpus
from worker_svc.diagnostics import search_check
from worker_svc.service import build_host as build_worker
from worker_svc.web.search import (
    MAX_ANSWER_BYTES,
    ArxivBackend,
    SearchBackend,
    SearchError,
    SearchResult,
    SemanticScholarBackend,
    http_backend,
)


@pytest.fixture
async def literature() -> AsyncIterator[Literature]:
    async with Literature() as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5) as client:
        yield client


def both(literature: Literature, http: httpx.AsyncClient) -> list[tuple[SearchBackend, Canned]]:
    """Each backend with the canned answer the test may change."""
    return [
        (ArxivBackend(http, literature.base_url), literature.arxiv),
        (SemanticScholarBackend(http, base_url=literature.base_url), literature.semantic_scholar),
    ]


async def test_arxiv_results_carry_authors_year_and_the_abstract(
    literature: Literature, http: httpx.AsyncClient
) -> None:
    backend = ArxivBackend(http, literature.base_url)
    results = await backend.search('wrought-iron (towers) AND "wind" ti:load', 5)
    assert results == [
        SearchResult(
            title="Wind Load on Wrought-Iron Lattice Towers",
            url="http://arxiv.org/abs/1901.00001v2",
            snippet="We measure how wind load limits the height of wrought-iron lattice towers "
            "and find that open lattices shed most of it.",
            authors=(
                *("Ada Girder", "Ben Rivet", "Cleo Truss", "Dan Strut"),
                *("Eve Gusset", "Finn Purlin", "Gail Spandrel"),
            ),
            year=2019,
        ),
        SearchResult(
            title="Rivet Fatigue in Nineteenth-Century Ironwork",
            url="http://arxiv.org/abs/2103.00002v1",  # no alternate link: the id is the abstract page
            snippet="Hot-driven rivets loosen under cyclic load.",
            authors=("Hal Anvil",),
            year=2021,
        ),
    ]
    [asked] = literature.asked
    assert asked.path == "/api/query"
    assert asked.query == {
        "search_query": "all:wrought-iron AND all:towers AND all:wind AND all:load",
        "start": "0",
        "max_results": "5",
        "sortBy": "relevance",
    }
    assert len(await backend.search("towers", 1)) == 1, "the limit is honoured even when the feed has more"
    assert literature.asked[-1].query["max_results"] == "1"


async def test_semantic_scholar_results_carry_authors_year_and_a_link(
    literature: Literature, http: httpx.AsyncClient
) -> None:
    results = await SemanticScholarBackend(http, base_url=literature.base_url).search("wrought-iron towers", 10)
    assert results == [
        SearchResult(
            title="Wind Load on Wrought-Iron Lattice Towers",
            url="https://www.semanticscholar.org/paper/aaa111",
            snippet="We measure how wind load limits the height of wrought-iron lattice towers.",
            authors=("Ada Girder", "Ben Rivet"),
            year=2019,
        ),
        SearchResult(
            title="Rivet Fatigue in Nineteenth-Century Ironwork",
            url="https://doi.org/10.1000/rivets.2",
            snippet="",
        ),
        SearchResult(title="Puddled Iron", url="https://arxiv.org/abs/2201.00003", snippet=""),
    ], "a paper with neither a URL, a DOI nor an arXiv id is left out"
    [asked] = literature.asked
    assert asked.path == "/graph/v1/paper/search"
    assert asked.query == {
        "query": "wrought iron towers",
        "limit": "10",
        "fields": "title,authors,year,abstract,url,externalIds",
    }
    assert "x-api-key" not in asked.headers, "no key configured: none sent"

    keyed = SemanticScholarBackend(http, api_key="s2-key", base_url=literature.base_url)
    assert len(await keyed.search("towers", 1)) == 1
    assert literature.asked[-1].headers["x-api-key"] == "s2-key"
    assert literature.asked[-1].query["limit"] == "1"


async def test_no_matches_are_an_empty_list(literature: Literature, http: httpx.AsyncClient) -> None:
    literature.arxiv = Canned(ARXIV_EMPTY.encode(), ATOM)
    literature.semantic_scholar = Canned(json.dumps({"total": 0, "offset": 0}).encode())  # no "data" at all
    for backend, _ in both(literature, http):
        assert await backend.search("aqueduct", 5) == [], type(backend).__name__
    asked = len(literature.asked)
    assert await ArxivBackend(http, literature.base_url).search('AND ( "" )', 5) == []
    assert len(literature.asked) == asked, "a query with no words is not sent"


@pytest.mark.parametrize(
    ("arxiv", "semantic_scholar", "problem"),
    [
        (b"<feed><entry>", b'{"data": [', "not XML|not JSON"),
        (b"<html><body>maintenance</body></html>", b'["a list"]', "not an Atom feed|unexpected shape"),
        (b"\xff\xfe garbage", b'{"data": "none"}', "not XML|unexpected shape"),
    ],
)
async def test_malformed_answers_are_search_errors(
    literature: Literature, http: httpx.AsyncClient, arxiv: bytes, semantic_scholar: bytes, problem: str
) -> None:
    literature.arxiv = Canned(arxiv, ATOM)
    literature.semantic_scholar = Canned(semantic_scholar)
    for backend, _ in both(literature, http):
        with pytest.raises(SearchError, match=problem):
            await backend.search("towers", 5)


async def test_error_statuses_and_rate_limits_are_search_errors(
    literature: Literature, http: httpx.AsyncClient
) -> None:
    for backend, canned in both(literature, http):
        canned.status = 503
        with pytest.raises(SearchError, match="answered HTTP 503"):
            await backend.search("towers", 5)
        canned.status, canned.headers = 429, {"retry-after": "7"}
        with pytest.raises(SearchError, match=r"limiting .* \(HTTP 429\): wait 7 seconds and search again"):
            await backend.search("towers", 5)
        canned.headers = {}
        with pytest.raises(SearchError, match=r"HTTP 429.*wait a minute and search again"):
            await backend.search("towers", 5)


async def test_an_entity_expansion_bomb_is_refused(literature: Literature, http: httpx.AsyncClient) -> None:
    literature.arxiv = Canned(ENTITY_BOMB.encode(), ATOM)
    with pytest.raises(SearchError, match="DTD or entity declarations; refused"):
        await ArxivBackend(http, literature.base_url).search("towers", 5)
    external = '<?xml version="1.0"?><!DOCTYPE feed [<!ENTITY x SYSTEM "file:///etc/passwd">]><feed>&x;</feed>'
    literature.arxiv = Canned(external.encode(), ATOM)
    with pytest.raises(SearchError, match="refused"):
        await ArxivBackend(http, literature.base_url).search("towers", 5)


async def test_huge_and_stalled_answers_are_search_errors(literature: Literature, http: httpx.AsyncClient) -> None:
    for backend, canned in both(literature, http):
        canned.body = b" " * (MAX_ANSWER_BYTES + 1)
        with pytest.raises(SearchError, match=f"more than {MAX_ANSWER_BYTES} bytes"):
            await backend.search("towers", 5)
    literature.arxiv.stall = literature.semantic_scholar.stall = True
    for backend in (
        ArxivBackend(http, literature.base_url, seconds=0.2),
        SemanticScholarBackend(http, base_url=literature.base_url, seconds=0.2),
    ):
        with pytest.raises(SearchError, match=r"did not answer within 0\.2 seconds"):
            await backend.search("towers", 5)


async def _diagnose(settings: WorkerSettings, tmp_path: Path) -> tuple[str, Finding]:
    async with httpx.AsyncClient() as client:
        backend = http_backend(settings, client)
        assert backend is not None
        check = search_check(settings, Corpus(tmp_path / "corpus.db"), backend)
        return check.name, await check.run()


async def test_the_workers_diagnostics_run_one_literature_search(literature: Literature, tmp_path: Path) -> None:
    name, found = await _diagnose(WorkerSettings(search_backend="arxiv", arxiv_url=literature.base_url), tmp_path)
    assert (name, found.status) == ("search (arxiv)", Status.OK) and "results for 'test'" in found.detail
    literature.semantic_scholar.status = 429
    settings = WorkerSettings(search_backend="semantic_scholar", semantic_scholar_url=literature.base_url)
    name, found = await _diagnose(settings, tmp_path)
    assert found.status == Status.FAILED and "HTTP 429" in found.detail, "no API key is needed, so it is asked"


async def test_a_delegation_on_arxiv_shows_the_model_authors_and_years(
    tmp_path: Path, model: ScriptedModel, literature: Literature
) -> None:
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=2)
    async with await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common) as scratchpad_host:
        settings = WorkerSettings(
            address="127.0.0.1:0",
            scratchpad_address=scratchpad_host.address,
            model_base_url=model.base_url,
            model_name="scripted",
            search_backend="arxiv",
            arxiv_url=literature.base_url,
        )
        async with (
            await build_worker(settings, common) as worker_host,
            insecure_channel(scratchpad_host.address) as scratchpad_channel,
            insecure_channel(worker_host.address) as worker_channel,
        ):
            thread = await ScratchpadClient(scratchpad_channel).create_thread(title="towers")
            model.script(
                Reply(calls=(Call("perform_web_search", {"query": "wrought iron towers"}, "s"),)),
                Reply(content="Two papers on iron towers."),
            )
            request = worker_pb2.DelegateRequest(
                delegation_id="run-1:call-1",
                run_id="run-1",
                tool_call_id="call-1",
                scratchpad_thread_id=thread.thread_id,
                task=worker_pb2.ResearchTask(objective="Find papers on wrought-iron towers."),
                role=common_pb2.ROLE_RESEARCHER,
            )
            stub = worker_pb2_grpc.WorkerServiceStub(worker_channel)
            events = [event async for event in stub.Delegate(request, timeout=60)]
    assert events[-1].result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED
    [seen] = [m["content"] for m in model.requests[1]["messages"] if m.get("tool_call_id") == "s"]
    assert seen.splitlines()[:4] == [
        "1. Wind Load on Wrought-Iron Lattice Towers",
        "   Ada Girder, Ben Rivet, Cleo Truss, Dan Strut, Eve Gusset et al. (2019)",
        "   http://arxiv.org/abs/1901.00001v2",
        "   We measure how wind load limits the height of wrought-iron lattice towers "
        "and find that open lattices shed most of it.",
    ]
    assert "   Hal Anvil (2021)" in seen.splitlines()
    assert literature.asked[0].query["search_query"] == "all:wrought AND all:iron AND all:towers"
