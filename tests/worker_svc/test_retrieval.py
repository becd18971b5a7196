"""Hybrid corpus search through the scripted server's deterministic embeddings: fusion, incremental vectors,
dimension checks, the endpoint failing while indexing and while searching, snippets, and web reranking."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from quarry.cli import main
from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.identity import Principal, Role
from quarry.research_plane import ResearchPlane
from tests.fakes.openai_server import HttpError, ScriptedModel, bag_of_words_vector
from worker_svc.corpus import Corpus, CorpusError
from worker_svc.retrieval import Embedder, EmbeddingSettings, RerankedSearch, reciprocal_rank_fusion
from worker_svc.tools import DelegationContext, SearchParams, perform_web_search
from worker_svc.web.pages import PageReader
from worker_svc.web.search import SearchResult, SearchResults

SYNONYMS = {"vessel": "ship", "vessels": "ship", "crossing": "voyage", "crossings": "voyage"}
DOCUMENTS = {
    "ships.md": "# Ships\n\nA ship makes a voyage across the sea from the harbour.",
    "harbours.md": "# Harbours\n\nThe harbour has cranes, quays and a harbour master; the harbour opens at dawn.",
    "trains.md": "# Trains\n\nA locomotive pulls wagons along the rail to the harbour.",
    "logbooks.md": "# Logbooks\n\nEvery voyage is written in the logbook by the captain.",
}
MODEL = "scripted-embedder"


@pytest.fixture
async def embeddings() -> AsyncIterator[ScriptedModel]:
    async with ScriptedModel(synonyms=SYNONYMS) as server:
        yield server


def embedder_for(server: ScriptedModel, dimensions: int | None = None, batch_size: int = 2) -> Embedder:
    settings = EmbeddingSettings(
        base_url=server.base_url, model=MODEL, dimensions=dimensions, batch_size=batch_size, max_retries=0
    )
    return Embedder(settings)


def write_documents(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in DOCUMENTS.items():
        (folder / name).write_text(text)
    return folder


async def urls(corpus: Corpus, query: str, limit: int = 10) -> list[str]:
    """The search's URLs, searched in a thread: the embeddings server answers on this event loop."""
    return [hit.result.url for hit in (await asyncio.to_thread(corpus.retrieve, query, limit)).hits]


def embedded_texts(server: ScriptedModel) -> list[str]:
    return [text for request in server.embedding_requests for text in request["input"]]


def vector_count(index: Path) -> int:
    with sqlite3.connect(index) as connection:
        (count,) = connection.execute("SELECT count(*) FROM vectors").fetchone()
    connection.close()
    return int(count)


def test_reciprocal_rank_fusion_sums_reciprocal_ranks() -> None:
    # a: 1/61 + 1/62, c: 1/63 + 1/61, b: 1/62, d: 1/63
    assert reciprocal_rank_fusion([["a", "b", "c"], ["c", "a", "d"]]) == ["a", "c", "b", "d"]
    # Second in both lists beats first in one.
    assert reciprocal_rank_fusion([["x", "both"], ["both", "y"]])[0] == "both"
    assert reciprocal_rank_fusion([["x"], ["y"]]) == ["x", "y"], "ties keep the order first seen"


async def test_hybrid_search_fuses_bm25_and_vector_ranks(embeddings: ScriptedModel, tmp_path: Path) -> None:
    index = tmp_path / "corpus.db"
    corpus = Corpus(index, embedder_for(embeddings))
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


async def test_only_changed_documents_are_embedded_again(embeddings: ScriptedModel, tmp_path: Path) -> None:
    docs = write_documents(tmp_path / "docs")
    index = tmp_path / "corpus.db"
    corpus = Corpus(index, embedder_for(embeddings, batch_size=3))
    first = await asyncio.to_thread(corpus.index_folder, docs)
    assert first.embedded == 4 and len(embedded_texts(embeddings)) == 4
    assert [len(request["input"]) for request in embeddings.embedding_requests] == [3, 1], "batches of 3"
    progress: list[tuple[int, int]] = []
    again = await asyncio.to_thread(lambda: corpus.index_folder(docs, progress=lambda *step: progress.append(step)))
    assert (again.unchanged, again.embedded, len(embeddings.embedding_requests), progress) == (4, 0, 2, [])

    assert "corpus://docs/logbooks.md" in await urls(corpus, "crossings")  # the vectors are in memory now
    (docs / "trains.md").write_text("# Trains\n\nA locomotive pulls a vessel on a barge to the harbour.")
    os.utime(docs / "trains.md", (1, 1))
    os.utime(docs / "ships.md", (1, 1))  # touched, not changed: the same text keeps its vectors
    (docs / "logbooks.md").unlink()
    embeddings.embedding_requests.clear()
    report = await asyncio.to_thread(lambda: corpus.index_folder(docs, progress=lambda *step: progress.append(step)))
    assert (sorted(report.updated), report.removed, report.embedded) == (["ships.md", "trains.md"], ["logbooks.md"], 1)
    assert embedded_texts(embeddings) == [
        "Trains\n\n# Trains\n\nA locomotive pulls a vessel on a barge to the harbour."
    ]
    assert progress == [(1, 1)]
    assert vector_count(index) == 3
    assert "corpus://docs/logbooks.md" not in await urls(corpus, "crossings"), "a search reads the new vectors"
    assert (await asyncio.to_thread(corpus.retrieve, "barge", 1)).hits[0].result.url == "corpus://docs/trains.md"
    status = corpus.embedding_status()
    assert (status.model, status.dimensions, status.documents, status.embedded) == (MODEL, 64, 3, 3)


async def test_documents_indexed_without_embeddings_get_vectors_later_whatever_their_root(
    embeddings: ScriptedModel, tmp_path: Path
) -> None:
    index = tmp_path / "corpus.db"
    write_documents(tmp_path / "docs")
    Corpus(index).index_folder(tmp_path / "docs")
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "canals.txt").write_text("Barges use the canal locks.")
    corpus = Corpus(index, embedder_for(embeddings))
    report = await asyncio.to_thread(corpus.index_folder, tmp_path / "more")
    assert (report.added, report.embedded) == (["canals.txt"], 5)
    assert vector_count(index) == 5


async def test_vectors_of_another_size_are_refused_clearly(embeddings: ScriptedModel, tmp_path: Path) -> None:
    docs = write_documents(tmp_path / "docs")
    index = tmp_path / "corpus.db"
    embeddings.force_dimensions = 8
    with pytest.raises(CorpusError, match="answered 8-dimensional vectors, but embedding_dimensions is 16") as error:
        await asyncio.to_thread(Corpus(index, embedder_for(embeddings, dimensions=16)).index_folder, docs)
    assert "nothing was written" in str(error.value)
    assert Corpus(index).roots() == [] and await urls(Corpus(index), "harbour") == []

    embeddings.force_dimensions = None
    corpus = Corpus(index, embedder_for(embeddings))
    await asyncio.to_thread(corpus.index_folder, docs)
    assert corpus.embedding_status().dimensions == 64
    # The model now answers another size under the same name: never mixed into the index.
    embeddings.force_dimensions = 32
    (docs / "canals.md").write_text("Barges use the canal locks.")
    with pytest.raises(CorpusError, match="answered 32-dimensional vectors, but the index holds 64-dimensional"):
        await asyncio.to_thread(corpus.index_folder, docs)
    assert vector_count(index) == 4
    retrieval = await asyncio.to_thread(corpus.retrieve, "harbour", 3)
    assert retrieval.mode == "bm25"
    assert "a 32-dimensional vector for the query, but the index holds 64-dimensional ones" in retrieval.notice
    report = await asyncio.to_thread(lambda: corpus.index_folder(docs, reembed=True))
    assert (report.embedded, report.reembedded) == (5, "asked to")
    assert corpus.embedding_status().dimensions == 32


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


async def test_the_endpoint_failing_while_indexing_writes_nothing(embeddings: ScriptedModel, tmp_path: Path) -> None:
    docs = write_documents(tmp_path / "docs")
    index = tmp_path / "corpus.db"
    corpus = Corpus(index, embedder_for(embeddings, batch_size=1))
    await asyncio.to_thread(corpus.index_folder, docs)
    (docs / "trains.md").write_text("# Trains\n\nThe funicular climbs the hill.")
    (docs / "canals.md").write_text("Barges use the canal locks.")
    embeddings.embedding_faults.extend([None, HttpError(500, message="the GPU fell over")])
    with pytest.raises(CorpusError) as error:
        await asyncio.to_thread(corpus.index_folder, docs)
    assert "answered HTTP 500: the GPU fell over; nothing was written: the index is as it was" in str(error.value)
    assert len(embeddings.embedding_requests) == 4 + 2, "the first batch was embedded, then the second failed"
    assert vector_count(index) == 4
    assert await urls(Corpus(index), "funicular canal") == []
    assert await urls(Corpus(index), "locomotive") == ["corpus://docs/trains.md"]

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    down = Corpus(index, Embedder(EmbeddingSettings(f"http://127.0.0.1:{port}/v1", MODEL, max_retries=0)))
    with pytest.raises(CorpusError, match=rf"127\.0\.0\.1:{port}/v1 \(model '{MODEL}'\) failed: APIConnectionError"):
        await asyncio.to_thread(down.index_folder, docs)
    assert vector_count(index) == 4

    report = await asyncio.to_thread(corpus.index_folder, docs)
    assert (sorted(report.added), report.updated, report.embedded) == (["canals.md"], ["trains.md"], 2)


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
        # With the endpoint back, the same search is hybrid and says nothing of it.
        text = await perform_web_search(SearchParams(query="vessel crossings harbour", limit=2), context)
        assert [line for line in text.splitlines() if not line.startswith(" ")] == ["1. Harbours", "2. Ships"]


async def test_snippets_come_from_the_hit_s_text_around_the_query_words(
    embeddings: ScriptedModel, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    filler = "Cargo is loaded and unloaded by day. " * 60
    (docs / "long.txt").write_text(filler + "The lighthouse keeper trims the lamp wick nightly. " + filler)
    corpus = Corpus(tmp_path / "corpus.db", embedder_for(embeddings))
    await asyncio.to_thread(corpus.index_folder, docs)
    [hit] = (await asyncio.to_thread(corpus.retrieve, "wicks", 1)).hits
    snippet = hit.result.snippet
    assert snippet.startswith("… ") and snippet.endswith(" …")
    assert "The lighthouse keeper trims the lamp wick nightly." in snippet
    assert len(snippet) <= 210


async def test_web_results_are_reranked_by_meaning(embeddings: ScriptedModel) -> None:
    class Engine:
        def __init__(self) -> None:
            self.limits: list[int] = []

        async def search(self, query: str, limit: int) -> list[SearchResult]:
            self.limits.append(limit)
            return [
                SearchResult("Harbour cranes", "https://a.example/cranes", "Cranes on the quays"),
                SearchResult("Rail timetable", "https://a.example/rail", "Locomotives and wagons"),
                SearchResult("Ocean voyages", "https://a.example/ships", "A ship on a long voyage"),
            ]

    engine = Engine()
    reranked = RerankedSearch(engine, embedder_for(embeddings))
    results = await reranked.search("vessel crossings", 2)
    assert engine.limits == [4], "twice the results asked for are reranked"
    # Its own ranks: cranes, rail, ships; by meaning: ships, cranes, rail. Fused: cranes (1/61 + 1/62),
    # ships (1/63 + 1/61), rail (1/62 + 1/63).
    assert [r.url for r in results] == ["https://a.example/cranes", "https://a.example/ships"]
    embeddings.embedding_faults.append(HttpError(500))
    results = await reranked.search("vessel crossings", 2)
    assert [r.url for r in results] == ["https://a.example/cranes", "https://a.example/rail"]
    assert isinstance(results, SearchResults) and "search service's own order" in results.notice


async def test_cli_indexes_with_embeddings_and_says_which_search_it_ran(
    embeddings: ScriptedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_documents(tmp_path / "docs")
    index = ["--index", str(tmp_path / "corpus.db")]
    assert await asyncio.to_thread(main, ["corpus", "index", str(tmp_path / "docs"), *index]) == 0
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["corpus", "search", "vessel harbour", "--limit", "1", *index]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["BM25 search (no embedding model configured)", "1. Harbours"]

    monkeypatch.setenv("QUARRY_WORKER_EMBEDDING_MODEL", MODEL)
    monkeypatch.setenv("QUARRY_MODEL_BASE_URL", embeddings.base_url)
    assert await asyncio.to_thread(main, ["corpus", "index", str(tmp_path / "docs"), *index]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [f"  4 documents embedded with {MODEL}"]
    assert await asyncio.to_thread(main, ["corpus", "list", *index]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"vectors: {MODEL}, 64 dimensions, for 4 of 4 documents"
    assert await asyncio.to_thread(main, ["corpus", "search", "vessel crossings", "--limit", "1", *index]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [f"hybrid search: BM25 fused with {MODEL} embeddings", "1. Ships"]
    assert out[2].startswith("   corpus://docs/ships.md")

    monkeypatch.setenv("QUARRY_WORKER_EMBEDDING_BASE_URL", "http://127.0.0.1:9/v1")
    assert await asyncio.to_thread(main, ["corpus", "search", "vessel harbour", "--limit", "1", *index]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("BM25 search alone: the embeddings endpoint http://127.0.0.1:9/v1")
    assert out[1] == "1. Harbours"


async def test_an_index_from_before_vectors_keeps_its_documents_and_gets_vectors(
    embeddings: ScriptedModel, tmp_path: Path
) -> None:
    index = tmp_path / "corpus.db"
    with sqlite3.connect(index) as old:  # schema 1: roots, files and documents
        old.executescript(
            "CREATE TABLE roots (id INTEGER PRIMARY KEY, folder TEXT UNIQUE, name TEXT NOT NULL UNIQUE,"
            " indexed_at REAL);"
            "CREATE TABLE files (key TEXT PRIMARY KEY, root INTEGER NOT NULL REFERENCES roots (id),"
            " path TEXT NOT NULL, size INTEGER NOT NULL, mtime REAL NOT NULL, UNIQUE (root, path));"
            "CREATE VIRTUAL TABLE documents USING fts5(path UNINDEXED, title, text, tokenize='porter unicode61');"
            f"INSERT INTO roots VALUES (1, '{tmp_path / 'old'}', 'old', 1.0);"
            "INSERT INTO files VALUES ('old/ships.md', 1, 'ships.md', 10, 1.0);"
            "INSERT INTO documents VALUES ('old/ships.md', 'Ships', 'A ship makes a voyage.');"
            "PRAGMA user_version = 1;"
        )
    old.close()
    corpus = Corpus(index, embedder_for(embeddings))
    assert (await corpus.read("corpus://old/ships.md"))[1] == "A ship makes a voyage."
    retrieval = await asyncio.to_thread(corpus.retrieve, "voyage", 5)
    assert [hit.result.url for hit in retrieval.hits] == ["corpus://old/ships.md"]
    assert retrieval.mode == "bm25" and "the index holds no vectors" in retrieval.notice
    report = await asyncio.to_thread(corpus.index_folder, write_documents(tmp_path / "docs"))
    assert report.embedded == 5, "the old root's document too"
    hits = (await asyncio.to_thread(corpus.retrieve, "vessel crossing", 5)).hits
    assert "corpus://old/ships.md" in [hit.result.url for hit in hits]
