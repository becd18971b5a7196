"""The index's vectors through the scripted server's deterministic embeddings: computed incrementally,
dimension checks, and the endpoint failing while indexing."""

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
