"""The index's vectors through the scripted server's deterministic embeddings: computed incrementally,
dimension checks, and the endpoint failing while indexing (what was committed stays; the next run goes on)."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from tests.fakes.openai_server import HttpError, ScriptedModel
from tests.worker_svc.corpus.documents import MODEL, embedded_texts, embedder_for, urls, vector_count, write_documents
from worker_svc.corpus import Corpus, CorpusError, Embedder, EmbeddingSettings


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
    assert "The text is indexed and the vectors computed before this are kept" in str(error.value)
    # The text went in first: BM25 finds it; no vector of the wrong size did.
    assert [root.documents for root in Corpus(index).roots()] == [4] and vector_count(index) == 0
    assert await urls(Corpus(index), "harbour") != []

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


async def test_a_batch_the_endpoint_fails_is_reported_by_document_and_the_rest_is_kept(
    embeddings: ScriptedModel, tmp_path: Path
) -> None:
    docs = write_documents(tmp_path / "docs")
    index = tmp_path / "corpus.db"
    corpus = Corpus(index, embedder_for(embeddings, batch_size=1))
    await asyncio.to_thread(corpus.index_folder, docs)
    (docs / "trains.md").write_text("# Trains\n\nThe funicular climbs the hill.")
    (docs / "canals.md").write_text("Barges use the canal locks.")
    embeddings.embedding_faults.extend([HttpError(500, message="the GPU fell over")])
    report = await asyncio.to_thread(corpus.index_folder, docs)
    # canals.md (first by key) failed; trains.md was embedded and committed all the same.
    assert report.not_embedded == [("corpus://docs/canals.md", report.not_embedded[0][1])]
    assert "answered HTTP 500: the GPU fell over" in report.not_embedded[0][1]
    assert (sorted(report.added), report.updated, report.embedded) == (["canals.md"], ["trains.md"], 1)
    assert vector_count(index) == 4
    assert await urls(Corpus(index), "canal") == ["corpus://docs/canals.md"], "its text is searchable"

    # An endpoint that is down: every batch fails; after three in a row it stops, keeping what it has.
    for name in ("a", "b", "c", "d"):
        (docs / f"{name}.md").write_text(f"Document {name} about ferries.")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    down = Corpus(index, Embedder(EmbeddingSettings(f"http://127.0.0.1:{port}/v1", MODEL, batch_size=1, max_retries=0)))
    with pytest.raises(CorpusError, match=r"failed: APIConnectionError.*\(3 batches in a row failed\)") as error:
        await asyncio.to_thread(down.index_folder, docs)
    assert "`quarry corpus index` again goes on from there" in str(error.value)
    assert vector_count(index) == 4

    # The next run embeds exactly what is missing: canals.md and the four new documents.
    embeddings.embedding_requests.clear()
    report = await asyncio.to_thread(corpus.index_folder, docs)
    assert (report.embedded, report.not_embedded) == (5, [])
    assert len(embeddings.embedding_requests) == 5
    assert vector_count(index) == 9


async def test_an_interrupted_embedding_keeps_the_batches_it_committed(
    embeddings: ScriptedModel, tmp_path: Path
) -> None:
    docs = write_documents(tmp_path / "docs")
    index = tmp_path / "corpus.db"
    corpus = Corpus(index, embedder_for(embeddings, batch_size=1))

    def stop_after_two(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt  # Ctrl-C, between two commits

    with pytest.raises(KeyboardInterrupt):
        await asyncio.to_thread(lambda: corpus.index_folder(docs, progress=stop_after_two))
    assert vector_count(index) == 2 and [root.documents for root in corpus.roots()] == [4]
    embeddings.embedding_requests.clear()
    report = await asyncio.to_thread(corpus.index_folder, docs)
    assert (report.unchanged, report.embedded, len(embeddings.embedding_requests)) == (4, 2, 2)
    assert vector_count(index) == 4


async def test_vectors_with_nan_stop_the_index_clearly(embeddings: ScriptedModel, tmp_path: Path) -> None:
    docs = write_documents(tmp_path / "docs")
    index = tmp_path / "corpus.db"
    embeddings.force_nan = True
    with pytest.raises(CorpusError, match="answered vectors with NaN or infinite values"):
        await asyncio.to_thread(Corpus(index, embedder_for(embeddings)).index_folder, docs)
    assert vector_count(index) == 0 and [root.documents for root in Corpus(index).roots()] == [4]


async def test_embedding_requests_run_concurrently_within_the_bound(embeddings: ScriptedModel, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for n in range(12):
        (docs / f"d{n:02}.md").write_text(f"Document {n} about harbours and ferries.")
    embeddings.embedding_delay = 0.1
    corpus = Corpus(tmp_path / "corpus.db", embedder_for(embeddings, batch_size=1, concurrency=3))
    report = await asyncio.to_thread(corpus.index_folder, docs)
    assert report.embedded == 12 and vector_count(tmp_path / "corpus.db") == 12
    assert embeddings.embeddings_in_flight_most == 3


async def test_passages_of_another_size_re_embed_the_index(embeddings: ScriptedModel, tmp_path: Path) -> None:
    docs = write_documents(tmp_path / "docs")
    index = tmp_path / "corpus.db"
    await asyncio.to_thread(Corpus(index, embedder_for(embeddings)).index_folder, docs)
    smaller = EmbeddingSettings(embeddings.base_url, MODEL, max_retries=0, passage_tokens=64, passage_overlap_tokens=8)
    report = await asyncio.to_thread(Corpus(index, Embedder(smaller)).index_folder, docs)
    assert (report.embedded, report.reembedded) == (4, "the index held passages of 256/32 tokens, not 64/8")
    assert report.embedded_share == 1.0
    again = await asyncio.to_thread(Corpus(index, Embedder(smaller)).index_folder, docs)
    assert (again.embedded, again.reembedded) == (0, "")
