"""The index's passage vectors: computed for every document without them, in the indexing's transaction,
and held in memory as one matrix per version of them, so that a search is one matrix product.

A document keeps its vectors while its text's hash stays the same; every document without vectors
gets them, whichever root it is in, so a new embedding model re-embeds the whole index in one go.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worker_svc.corpus.embeddings import Embedder, EmbeddingError, UnusableVectors, Vectors
from worker_svc.corpus.schema import meta, set_meta
from worker_svc.corpus.text import PassageSize, embedded_share, non_blank_chars, passages

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


@dataclass(frozen=True)
class EmbeddingStatus:
    model: str | None  # the model the index's vectors come from; None when it has none
    dimensions: int | None
    documents: int
    embedded: int  # documents with vectors


class VectorsUnusable(Exception):
    """The index's vectors cannot answer this query; the message says why, for the reader."""


def _space(model: str | None, dimensions: int | None) -> str:
    """Which vectors, in words: `64-dimensional vectors from 'model'`."""
    return f"{'' if dimensions is None else f'{dimensions}-dimensional '}vectors from {model!r}"


@dataclass
class Embedded:
    """What one indexing's embedding did."""

    documents: int = 0  # given vectors
    reembedded: str = ""  # why every document was embedded again, if it was
    # Of the embedded documents' non-blank characters: how many, and how many some passage holds.
    characters: int = 0
    held: float = 0.0

    @property
    def share(self) -> float:
        """How much of the embedded documents' text is in some passage: 1.0 when all of it."""
        return self.held / self.characters if self.characters else 1.0

    failed: list[tuple[int, str]] = field(default_factory=list)  # (document rowid, why): no vectors yet


@dataclass(frozen=True)
class _Unit:
    """Documents committed together once all their passages are embedded: several small ones in one batch, or
    one long document over several batches."""

    docs: tuple[int, ...]
    batches: tuple[tuple[tuple[int, int, str], ...], ...]  # (doc, start, text) per passage
    characters: int  # the documents' non-blank characters
    held: float  # how many of them some passage holds


# Failed units in a row after which the endpoint is taken to be down: indexing stops, keeping what it wrote.
MAX_FAILED_IN_A_ROW = 3


def embed_missing(
    connection: sqlite3.Connection,
    embedder: Embedder,
    reembed: bool,
    progress: Callable[[int, int], None] | None,
    commit: Callable[[], None],
) -> Embedded:
    """Vectors for every document without them, in batches of whole documents, `embedder.settings.concurrency`
    requests at a time, each unit committed (`commit`) as it is written, so an interrupted indexing goes on where
    it stopped. A unit the endpoint fails (after its own retries) is reported by document and the rest goes on;
    MAX_FAILED_IN_A_ROW of them, or vectors that cannot be used (another size than the index's, NaN), raise
    EmbeddingError, what was committed staying."""
    stored = meta(connection)
    model, wanted = stored.get("embedding_model"), embedder.settings
    dimensions = int(stored["embedding_dimensions"]) if "embedding_dimensions" in stored else None
    size = PassageSize(wanted.passage_tokens, wanted.passage_overlap_tokens)
    passages_were = stored.get("embedding_passages")  # absent in an index written before passages had a size
    done = Embedded()
    if reembed or model != wanted.model or wanted.dimensions not in (None, dimensions):
        if connection.execute("SELECT 1 FROM vectors LIMIT 1").fetchone():
            done.reembedded = (
                "asked to"
                if reembed
                else f"the index held {_space(model, dimensions)}, not {_space(wanted.model, wanted.dimensions)}"
            )
        connection.execute("DELETE FROM vectors")
        set_meta(connection, "embedding_model", wanted.model)
        set_meta(connection, "embedding_dimensions", None)
        dimensions = None
    elif passages_were not in (None, _passages(size)) and connection.execute("SELECT 1 FROM vectors").fetchone():
        done.reembedded = f"the index held passages of {passages_were} tokens, not {_passages(size)}"
        connection.execute("DELETE FROM vectors")
    set_meta(connection, "embedding_passages", _passages(size))
    todo = [
        doc
        for (doc,) in connection.execute(
            "SELECT doc FROM files WHERE doc IS NOT NULL"
            " AND NOT EXISTS (SELECT 1 FROM vectors WHERE vectors.doc = files.doc) ORDER BY key"
        )
    ]
    failed_in_a_row = 0
    with ThreadPoolExecutor(max_workers=wanted.concurrency, thread_name_prefix="embed") as pool:
        in_flight: deque[tuple[_Unit, list[Future[Vectors]]]] = deque()
        units = _units(connection, todo, wanted.batch_size, size)
        try:
            while True:
                while sum(len(futures) for _, futures in in_flight) < wanted.concurrency:
                    unit = next(units, None)
                    if unit is None:
                        break
                    in_flight.append((unit, [pool.submit(embedder.embed, [t for *_, t in b]) for b in unit.batches]))
                if not in_flight:
                    break
                unit, futures = in_flight.popleft()
                try:
                    answers = [future.result() for future in futures]
                except UnusableVectors:
                    raise
                except EmbeddingError as error:
                    done.failed.extend((doc, str(error)) for doc in unit.docs)
                    failed_in_a_row += 1
                    if failed_in_a_row >= MAX_FAILED_IN_A_ROW:
                        raise EmbeddingError(f"{error} ({failed_in_a_row} batches in a row failed)") from error
                    continue
                failed_in_a_row = 0
                for batch, vectors in zip(unit.batches, answers, strict=True):
                    dimensions = _check_size(wanted.model, dimensions, vectors)
                    connection.executemany(
                        "INSERT INTO vectors (doc, start, vector) VALUES (?, ?, ?)",
                        [
                            (doc, start, vector.astype("<f4").tobytes())
                            for (doc, start, _), vector in zip(batch, vectors, strict=True)
                        ],
                    )
                set_meta(connection, "embedding_dimensions", dimensions)
                commit()
                done.documents += len(unit.docs)
                done.characters += unit.characters
                done.held += unit.held
                if progress is not None:
                    progress(done.documents + len(done.failed), len(todo))
        finally:
            for _, futures in in_flight:
                for future in futures:
                    future.cancel()
    return done


def _check_size(model: str, dimensions: int | None, vectors: Vectors) -> int:
    """The index's size once these vectors are in; UnusableVectors when they are of another."""
    size = int(vectors.shape[1])
    if dimensions is not None and size != dimensions:
        raise UnusableVectors(
            f"{model!r} answered {size}-dimensional vectors, but the index holds {dimensions}-dimensional ones "
            "from it; `quarry corpus index --reembed` computes them all again"
        )
    return size


def _passages(size: PassageSize) -> str:
    return f"{size.tokens}/{size.overlap_tokens}"


def _units(connection: sqlite3.Connection, docs: list[int], batch_size: int, size: PassageSize) -> Iterator[_Unit]:
    """The documents' passages in batches of at most `batch_size`, never splitting a document between units."""
    pending_docs: list[int] = []
    pending: list[tuple[int, int, str]] = []
    characters, held = 0, 0.0
    for doc in docs:
        title, text = connection.execute("SELECT title, text FROM documents WHERE rowid = ?", (doc,)).fetchone()
        cut = passages(title, text, size)
        pieces = [(doc, start, passage) for start, passage in cut]
        count = non_blank_chars(text)
        share = embedded_share(text, cut, title, size)
        if pending and len(pending) + len(pieces) > batch_size:
            yield _Unit(tuple(pending_docs), (tuple(pending),), characters, held)
            pending_docs, pending, characters, held = [], [], 0, 0.0
        if len(pieces) > batch_size:
            chunks = tuple(tuple(pieces[at : at + batch_size]) for at in range(0, len(pieces), batch_size))
            yield _Unit((doc,), chunks, count, share * count)
            continue
        pending_docs.append(doc)
        pending.extend(pieces)
        characters += count
        held += share * count
    if pending:
        yield _Unit(tuple(pending_docs), (tuple(pending),), characters, held)


def embedding_status(connection: sqlite3.Connection) -> EmbeddingStatus:
    """Which model the index's vectors are from, and how many documents have them."""
    stored = meta(connection)
    (documents,) = connection.execute("SELECT count(*) FROM files").fetchone()
    (embedded,) = connection.execute("SELECT count(DISTINCT doc) FROM vectors").fetchone()
    dimensions = stored.get("embedding_dimensions")
    return EmbeddingStatus(
        model=stored.get("embedding_model") if embedded else None,
        dimensions=int(dimensions) if dimensions and embedded else None,
        documents=documents,
        embedded=embedded,
    )


@dataclass(frozen=True)
class _Matrix:
    """Every passage vector of one vectors_version, in memory."""

    version: str
    vectors: Vectors  # one row per passage, ordered by document, then start
    starts: npt.NDArray[np.int64]  # each passage's start in its document's text
    docs: npt.NDArray[np.int64]  # each document once, in the rows' order
    first: npt.NDArray[np.int64]  # the row of each document's first passage


class PassageVectors:
    """One index's vectors in memory, shared by its searches (thread-safe)."""

    def __init__(self) -> None:
        self._matrix: _Matrix | None = None
        self._lock = threading.Lock()

    def nearest(self, connection: sqlite3.Connection, embedder: Embedder, query: str, depth: int) -> dict[int, int]:
        """The `depth` documents whose passages are nearest the query, best first, each with its best
        passage's start. Raises VectorsUnusable or EmbeddingError."""
        stored = meta(connection)
        model, stored_dimensions = stored.get("embedding_model"), stored.get("embedding_dimensions")
        wanted = embedder.settings
        if (
            model is None
            or stored_dimensions is None
            or not connection.execute("SELECT 1 FROM vectors LIMIT 1").fetchone()
        ):
            raise VectorsUnusable(
                f"the index holds no vectors; `quarry corpus index FOLDER` computes them with {wanted.model!r}"
            )
        dimensions = int(stored_dimensions)
        if model != wanted.model or wanted.dimensions not in (None, dimensions):
            raise VectorsUnusable(
                f"the index holds {_space(model, dimensions)}, but the embeddings configured are "
                f"{_space(wanted.model, wanted.dimensions)}; "
                "`quarry corpus index --reembed FOLDER` computes them again"
            )
        query_vector = embedder.embed([query])[0]
        if query_vector.shape[0] != dimensions:
            raise VectorsUnusable(
                f"{wanted.model!r} answered a {query_vector.shape[0]}-dimensional vector for the query, but the "
                f"index holds {dimensions}-dimensional ones; `quarry corpus index --reembed FOLDER` computes them again"
            )
        import numpy as np  # here, as in embeddings.py: only workers that embed pay for it

        matrix = self._load(connection, stored.get("vectors_version", ""), dimensions)
        scores = matrix.vectors @ query_vector
        best = np.maximum.reduceat(scores, matrix.first)  # each document's best passage
        top = np.argsort(-best, kind="stable") if len(best) <= depth else np.argpartition(-best, depth - 1)[:depth]
        top = top[np.argsort(-best[top], kind="stable")]
        ends = np.append(matrix.first[1:], len(scores))
        nearest: dict[int, int] = {}
        for document in top:
            first, end = int(matrix.first[document]), int(ends[document])
            nearest[int(matrix.docs[document])] = int(matrix.starts[first + int(np.argmax(scores[first:end]))])
        return nearest

    def _load(self, connection: sqlite3.Connection, version: str, dimensions: int) -> _Matrix:
        """The index's vectors, read again only when an indexing has changed them since."""
        import numpy as np

        with self._lock:
            if self._matrix is None or self._matrix.version != version:
                rows = connection.execute("SELECT doc, start, vector FROM vectors ORDER BY doc, start").fetchall()
                vectors = np.frombuffer(b"".join(row[2] for row in rows), dtype="<f4").reshape(len(rows), dimensions)
                docs = np.array([row[0] for row in rows], dtype=np.int64)
                first = np.flatnonzero(np.diff(docs, prepend=-1))
                self._matrix = _Matrix(
                    version,
                    vectors.astype(np.float32),
                    np.array([row[1] for row in rows], dtype=np.int64),
                    docs[first],
                    first.astype(np.int64),
                )
            return self._matrix
