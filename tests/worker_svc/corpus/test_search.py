"""Search and reading: BM25 alone, BM25 fused with the vectors' ranks, falling back to BM25 and saying why,
and corpus:// URLs read like web pages."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.identity import Principal, Role
from quarry.research_plane import ResearchPlane
from tests.fakes.openai_server import HttpError, ScriptedModel, bag_of_words_vector
from tests.worker_svc.corpus.documents import SYNONYMS, embedder_for, urls, write_documents
from worker_svc.corpus import Corpus, reciprocal_rank_fusion
from worker_svc.corpus.fusion import Fusion
from worker_svc.tools import DelegationContext, SearchParams, perform_web_search
from worker_svc.web.pages import PageError, PageReader
from worker_svc.web.search import SearchResults


async def test_index_search_and_read(corpus: Corpus, tmp_path: Path) -> None:
    report = corpus.index_folder(tmp_path / "docs")
    assert report.root == "docs"
    assert sorted(report.added) == ["bridges.txt", "eiffel.md", "notes/louvre.html", "report.pdf"]
    results = await corpus.search("eiffel tower height", 10)
    assert results[0].url == "corpus://docs/eiffel.md", "bm25 ranks the most relevant document first"
    assert results[0].title == "The Eiffel Tower"
    assert {r.url for r in results} >= {"corpus://docs/eiffel.md", "corpus://docs/report.pdf"}
    assert await corpus.search('mona "lisa', 5), "quotes and operators in a query are just words"
    assert await corpus.search("", 5) == []
    title, text = await corpus.read("corpus://docs/notes/louvre.html")
    assert title == "The Louvre" and "Mona Lisa" in text


async def test_a_document_with_only_the_query_s_common_words_is_no_match(corpus: Corpus, tmp_path: Path) -> None:
    corpus.index_folder(tmp_path / "docs")
    assert {r.url for r in await corpus.search("how tall is the tower", 10)} == {
        "corpus://docs/eiffel.md",
        "corpus://docs/bridges.txt",
        "corpus://docs/report.pdf",
    }, "the Louvre's page has `is` and `the`, not `tall` or `tower`"
    assert len(await corpus.search("is the", 10)) == 4, "a query of common words alone still looks for them"


async def test_page_tools_read_corpus_urls_like_web_pages(corpus: Corpus, tmp_path: Path) -> None:
    corpus.index_folder(tmp_path / "docs")
    async with httpx.AsyncClient() as client:
        reader = PageReader(client, corpus=corpus)
        page = await reader.read("corpus://docs/eiffel.md")
        assert page.contains("the tower is 330 metres tall")
        with pytest.raises(PageError, match="not in the corpus"):
            await reader.read("corpus://docs/missing.md")


async def test_hybrid_search_fuses_bm25_and_vector_ranks(embeddings: ScriptedModel, tmp_path: Path) -> None:
    index = tmp_path / "corpus.db"
    equal_weights = Fusion(k=60, lexical_weight=1.0, semantic_weight=1.0)
    corpus = Corpus(index, embedder_for(embeddings), equal_weights)
    report = await asyncio.to_thread(corpus.index_folder, write_documents(tmp_path / "docs"))
    assert report.embedded == 4
    query = "vessel crossings to the harbour"
    bm25 = await urls(Corpus(index), query)
    # BM25 sees only `harbour` (`to` and `the` are in every page, so they are not looked for).
    assert bm25 == [f"corpus://docs/{name}" for name in ("harbours.md", "trains.md", "ships.md")]
    by_meaning = []
    question = bag_of_words_vector(query, 64, SYNONYMS)
    for url in [*bm25, "corpus://docs/logbooks.md"]:
        title, text = await corpus.read(url)
        page = bag_of_words_vector(f"{title}\n\n{text}", 64, SYNONYMS)
        by_meaning.append((-sum(a * b for a, b in zip(question, page, strict=True)), url))
    vectors = [url for _, url in sorted(by_meaning)]
    retrieval = await asyncio.to_thread(corpus.retrieve, query, 10)
    hybrid = [hit.result.url for hit in retrieval.hits]
    assert (retrieval.mode, retrieval.notice) == ("hybrid", "")
    assert hybrid == reciprocal_rank_fusion([bm25, vectors])
    assert vectors[0] == "corpus://docs/ships.md", "the page about vessels' crossings, in other words"
    assert hybrid[:2] == ["corpus://docs/harbours.md", "corpus://docs/ships.md"], "first in one, second in the other"
    assert hybrid not in (bm25, vectors), "fusion is neither ranking alone"
    assert "corpus://docs/logbooks.md" in hybrid, "a page without any of the words, found by meaning"
    assert [r.url for r in await corpus.search(query, 2)] == hybrid[:2], "the worker's search is the same search"
    # With the default fusion, the vectors weigh more: their first hit comes first.
    weighted = await asyncio.to_thread(Corpus(index, embedder_for(embeddings)).retrieve, query, 10)
    assert [hit.result.url for hit in weighted.hits][:2] == ["corpus://docs/ships.md", "corpus://docs/harbours.md"]


async def test_a_document_without_the_query_words_is_found_by_meaning(
    embeddings: ScriptedModel, tmp_path: Path
) -> None:
    index = tmp_path / "corpus.db"
    corpus = Corpus(index, embedder_for(embeddings))
    await asyncio.to_thread(corpus.index_folder, write_documents(tmp_path / "docs"))
    assert await urls(Corpus(index), "vessel crossings") == [], "no page has these words"
    hits = (await asyncio.to_thread(corpus.retrieve, "vessel crossings", 2)).hits
    assert hits[0].result.url == "corpus://docs/ships.md"
    assert hits[0].result.snippet == "# Ships A ship makes a voyage across the sea from the harbour."


async def test_search_refuses_vectors_from_another_model_and_says_so(embeddings: ScriptedModel, tmp_path: Path) -> None:
    index = tmp_path / "corpus.db"
    await asyncio.to_thread(Corpus(index, embedder_for(embeddings)).index_folder, write_documents(tmp_path / "docs"))
    other = Corpus(index, embedder_for(embeddings, dimensions=16))
    requests = len(embeddings.embedding_requests)
    results = await other.search("harbour", 2)
    assert [r.url for r in results] == ["corpus://docs/harbours.md", "corpus://docs/trains.md"], "BM25 answers"
    assert isinstance(results, SearchResults)
    assert (
        "holds 64-dimensional vectors from 'scripted-embedder', but the embeddings configured are 16-dimensional"
        in (results.notice)
    )
    assert len(embeddings.embedding_requests) == requests, "the endpoint is not asked for a vector it cannot use"
    # Indexing with the new configuration embeds everything again.
    report = await asyncio.to_thread(other.index_folder, tmp_path / "docs")
    assert report.embedded == 4
    assert report.reembedded == (
        "the index held 64-dimensional vectors from 'scripted-embedder', "
        "not 16-dimensional vectors from 'scripted-embedder'"
    )
    assert (await asyncio.to_thread(other.retrieve, "harbour", 2)).mode == "hybrid"


async def test_the_endpoint_failing_at_search_time_falls_back_to_bm25_and_says_so(
    embeddings: ScriptedModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    corpus = Corpus(tmp_path / "corpus.db", embedder_for(embeddings))
    await asyncio.to_thread(corpus.index_folder, write_documents(tmp_path / "docs"))
    embeddings.embedding_faults.append(HttpError(503, message="overloaded"))
    async with httpx.AsyncClient() as web, insecure_channel("127.0.0.1:9") as channel:
        context = DelegationContext(
            scratchpad=ResearchPlane(ScratchpadClient(channel)),
            scratchpad_thread_id="thread",
            author=Principal("run:call", Role.RESEARCHER),
            search=corpus,
            pages=PageReader(web),
        )
        with caplog.at_level(logging.WARNING, logger="worker_svc.corpus"):
            text = await perform_web_search(SearchParams(query="vessel crossings harbour", limit=2), context)
        lines = text.splitlines()
        assert lines[0].startswith("Keyword (BM25) search only: the embeddings endpoint")
        assert "answered HTTP 503: overloaded" in lines[0]
        assert [line for line in lines if line[0].isdigit()] == ["1. Harbours", "2. Trains"]
        assert any("corpus search fell back to BM25 alone" in record.getMessage() for record in caplog.records)
        # With the endpoint back, the same search is hybrid (the page about vessels, found by meaning, first)
        # and says nothing of it.
        text = await perform_web_search(SearchParams(query="vessel crossings harbour", limit=2), context)
        assert [line for line in text.splitlines() if not line.startswith(" ")] == ["1. Ships", "2. Harbours"]
