"""The Corpus: one index file, opened for each call, and everything the worker and the CLI ask of it."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from worker_svc.corpus import indexing, schema, search, vectors
from worker_svc.corpus.embeddings import Embedder
from worker_svc.corpus.fusion import DEFAULT_FUSION, Fusion
from worker_svc.corpus.indexing import IndexReport, Root
from worker_svc.corpus.schema import CorpusError
from worker_svc.corpus.search import Retrieval, match_expression
from worker_svc.corpus.vectors import EmbeddingStatus, PassageVectors
from worker_svc.web.search import SearchResult, SearchResults


class Corpus:
    def __init__(self, index_path: Path, embedder: Embedder | None = None, fusion: Fusion = DEFAULT_FUSION) -> None:
        self.index_path = index_path
        # Without one, indexing writes no vectors and search is BM25 alone.
        self.embedder = embedder
        self._fusion = fusion
        self._vectors = PassageVectors()

    def _connect(self, *, write: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        return schema.connect(self.index_path, write=write)

    def index_folder(
        self, folder: Path, *, reembed: bool = False, progress: Callable[[int, int], None] | None = None
    ) -> IndexReport:
        """Add the folder as a root, or bring its root in line with it; other roots are left alone, but for
        their missing vectors (blocking). reembed: compute every vector again. progress(done, total): documents
        embedded so far."""
        folder = folder.resolve()
        if not folder.is_dir():
            raise CorpusError(f"{folder} is not a folder")
        if reembed and self.embedder is None:
            raise CorpusError("re-embedding needs an embedding model: set QUARRY_WORKER_EMBEDDING_MODEL")
        with self._connect(write=True) as connection:
            return indexing.index_folder(connection, folder, self.embedder, reembed, progress)

    def roots(self) -> list[Root]:
        """Every root, by name, with its document count."""
        with self._connect() as connection:
            return indexing.roots(connection)

    def remove_root(self, which: str) -> Root:
        """Drop a root, named by its folder or its name, and its documents; returns what it was."""
        with self._connect(write=True) as connection:
            return indexing.remove_root(connection, which, self.index_path)

    def embedding_status(self) -> EmbeddingStatus:
        """Which model the index's vectors are from, and how many documents have them."""
        with self._connect() as connection:
            return vectors.embedding_status(connection)

    def document_count(self) -> int:
        """How many documents the index holds, read without creating or upgrading it (blocking).

        Raises CorpusError when there is no index, or the file is not one."""
        return schema.document_count(self.index_path)

    def retrieve(self, query: str, limit: int) -> Retrieval:
        """The best `limit` documents for the query, with snippets, and how they were found (blocking)."""
        expression = match_expression(query)
        if not expression:
            return Retrieval([], "bm25")
        with self._connect() as connection:
            return search.retrieve(connection, expression, query, limit, self.embedder, self._vectors, self._fusion)

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        """Best matches first: BM25 and vectors fused, or BM25 alone (with a notice when it fell back)."""
        retrieval = await asyncio.to_thread(self.retrieve, query, limit)
        notice = f"Keyword (BM25) search only: {retrieval.notice}." if retrieval.notice else ""
        return SearchResults((hit.result for hit in retrieval.hits), notice=notice)

    def _read(self, url: str) -> tuple[str, str]:
        with self._connect() as connection:
            return search.read(connection, url)

    async def read(self, url: str) -> tuple[str, str]:
        """(title, text) of an indexed document."""
        return await asyncio.to_thread(self._read, url)
