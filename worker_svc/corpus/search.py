"""Search and reading: the BM25 ranking fused with the vectors' (reciprocal rank fusion), or BM25 alone
when there is no embedder or its embeddings cannot be used, saying why; snippets cut from the stored
text of the hits returned, nothing else; and a document's text by its corpus:// URL."""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from worker_svc.corpus.embeddings import Embedder, EmbeddingError
from worker_svc.corpus.fusion import Fusion
from worker_svc.corpus.schema import SCHEME
from worker_svc.corpus.text import COMMON_WORDS, snippet
from worker_svc.corpus.vectors import PassageVectors, VectorsUnusable
from worker_svc.web.pages import PageError
from worker_svc.web.search import SearchResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hit:
    result: SearchResult
    file: Path | None  # where the document was read from; None for the legacy root's


@dataclass(frozen=True)
class Retrieval:
    hits: list[Hit]
    mode: Literal["hybrid", "bm25"]
    # Why the search was BM25 alone although an embedder is configured; empty otherwise.
    notice: str = ""


def match_expression(query: str) -> str:
    """Free text as an FTS5 query: every word quoted (no syntax errors), any word may match. Common words
    are left out when others remain: a document that has only those is no match, whatever its rank."""
    words = [word.replace('"', '""') for word in query.split()]
    content = [word for word in words if word.lower().strip(".,;:!?'\"()") not in COMMON_WORDS]
    return " OR ".join(f'"{word}"' for word in content or words)


def retrieve(
    connection: sqlite3.Connection,
    expression: str,
    query: str,
    limit: int,
    embedder: Embedder | None,
    vectors: PassageVectors,
    fusion: Fusion,
) -> Retrieval:
    """The best `limit` documents for the query (its match expression given), with snippets, and how
    they were found."""
    # One snapshot: the documents, the vectors and their version agree whatever an indexing commits.
    connection.execute("BEGIN")
    try:
        return _retrieve(connection, expression, query, limit, embedder, vectors, fusion)
    finally:
        connection.execute("COMMIT")


def _retrieve(
    connection: sqlite3.Connection,
    expression: str,
    query: str,
    limit: int,
    embedder: Embedder | None,
    vectors: PassageVectors,
    fusion: Fusion,
) -> Retrieval:
    depth = limit if embedder is None else max(limit, fusion.depth)
    lexical = [
        doc
        for (doc,) in connection.execute(
            "SELECT rowid FROM documents WHERE documents MATCH ? ORDER BY rank LIMIT ?", (expression, depth)
        )
    ]
    if embedder is None:
        return Retrieval(_hits(connection, lexical[:limit], query, {}), "bm25")
    try:
        nearest = vectors.nearest(connection, embedder, query, depth)
    except (VectorsUnusable, EmbeddingError) as error:
        log.warning("corpus search fell back to BM25 alone: %s", error)
        return Retrieval(_hits(connection, lexical[:limit], query, {}), "bm25", str(error))
    fused = fusion.fuse(lexical, list(nearest))[:limit]
    return Retrieval(_hits(connection, fused, query, nearest), "hybrid")


def _hits(connection: sqlite3.Connection, docs: list[int], query: str, passages: dict[int, int]) -> list[Hit]:
    """The documents as hits, in the order given, snippets cut from their stored text."""
    if not docs:
        return []
    marks = ", ".join("?" * len(docs))
    documents = {
        doc: (path, title, text)
        for doc, path, title, text in connection.execute(
            f"SELECT rowid, path, title, text FROM documents WHERE rowid IN ({marks})", docs
        )
    }
    files = {
        doc: (folder, path)
        for doc, folder, path in connection.execute(
            f"SELECT doc, folder, path FROM files JOIN roots ON roots.id = files.root WHERE doc IN ({marks})", docs
        )
    }
    hits = []
    for doc in docs:
        key, title, text = documents[doc]
        folder, relative = files.get(doc, (None, ""))
        hits.append(
            Hit(
                result=SearchResult(title=title, url=SCHEME + key, snippet=snippet(text, query, passages.get(doc))),
                file=None if folder is None else Path(folder) / relative,
            )
        )
    return hits


def read(connection: sqlite3.Connection, url: str) -> tuple[str, str]:
    """(title, text) of an indexed document; PageError when the corpus has none at that URL."""
    key = url.removeprefix(SCHEME)
    row = connection.execute(
        "SELECT title, text FROM documents WHERE rowid = (SELECT doc FROM files WHERE key = ?)", (key,)
    ).fetchone()
    if row is None:
        raise PageError(f"{url} is not in the corpus")
    return str(row[0]), str(row[1])
