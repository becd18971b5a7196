"""The local document corpus: folders of Markdown, HTML, text and PDF, indexed with SQLite FTS5.

Each indexed folder is a root with a name (its folder's name, made unique), and
its documents are cited as `corpus://<root name>/<path relative to the folder>`,
read from the index by the same page tools as the web, so local and web sources
are verified the same way. Indexing a root is incremental and touches only that
root: unchanged files (same size and modification time) are skipped, and files
gone from the folder leave the index; other roots stay as they are until removed.

With an embedder, each document's passages also get vectors, stored in the same
file and computed after the text, in the same transaction: a failure leaves the
index as it was. A document keeps its vectors while its text's hash stays the
same; every document without vectors gets them, whichever root it is in, so a
new embedding model re-embeds the whole index in one go. Search then fuses the
BM25 ranking with the vectors' (reciprocal rank fusion); without an embedder, or
when the embeddings cannot be used, it is BM25 alone and says why. Snippets are
cut from the stored text of the hits returned, nothing else.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from worker_svc.retrieval import Embedder, EmbeddingError, Vectors, reciprocal_rank_fusion
from worker_svc.web.pages import PageError, extract
from worker_svc.web.search import SearchResult, SearchResults

log = logging.getLogger(__name__)

SCHEME = "corpus://"
CONTENT_TYPES = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".txt": "text/plain",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
}
MAX_FILE_BYTES = 50 * 1024 * 1024
# How much of a file decides whether it is text.
SNIFF_BYTES = 8192
# The name of the root that holds what an index written before roots were tracked held.
LEGACY_ROOT = "legacy"

# Characters of text per embedded passage: under the 512 tokens many embedding models take.
PASSAGE_CHARS = 1500
# How deep each ranking goes before fusion.
FUSION_DEPTH = 50
# Characters of text a snippet shows, about FTS5's 24-token snippets.
SNIPPET_CHARS = 200
# Occurrences of the query's words a snippet chooses among: the first ones, in a long text.
SNIPPET_MATCHES = 500
# Words neither the search nor a snippet looks for, beside others: they are everywhere.
_COMMON_WORDS_TEXT = (
    "a an and are as at be by can do does for from how i in is it of on or that the this to what when which why with"
)
_COMMON_WORDS = frozenset(_COMMON_WORDS_TEXT.split())

# Version 2 (PRAGMA user_version): vectors, and each file's document rowid and text hash.
# Version 1: several roots. Version 0, one unrecorded folder, had `files (path PRIMARY KEY,
# size, mtime)` and the same `documents` table.
SCHEMA_VERSION = 2
_SCHEMA_V1 = (
    # folder is NULL for the legacy root, whose folder was never recorded.
    "CREATE TABLE roots (id INTEGER PRIMARY KEY, folder TEXT UNIQUE, name TEXT NOT NULL UNIQUE, indexed_at REAL)",
    # key: the document's path in `documents`, its URL without the scheme.
    "CREATE TABLE files (key TEXT PRIMARY KEY, root INTEGER NOT NULL REFERENCES roots (id), path TEXT NOT NULL,"
    " size INTEGER NOT NULL, mtime REAL NOT NULL, UNIQUE (root, path))",
    "CREATE VIRTUAL TABLE IF NOT EXISTS documents USING fts5(path UNINDEXED, title, text, tokenize='porter unicode61')",
)
_SCHEMA_V2 = (
    # doc: the document's rowid in `documents` (path is not indexed there); hash: of its title and text.
    "ALTER TABLE files ADD COLUMN doc INTEGER",
    "ALTER TABLE files ADD COLUMN hash TEXT",
    "CREATE INDEX files_doc ON files (doc)",
    # One row per passage: where it starts in the text, and its unit vector as little-endian float32.
    "CREATE TABLE vectors (doc INTEGER NOT NULL, start INTEGER NOT NULL, vector BLOB NOT NULL,"
    " PRIMARY KEY (doc, start))",
    # embedding_model and embedding_dimensions: the space of every vector; vectors_version: bumped on each write.
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


class CorpusError(Exception):
    """An index that cannot be used, a folder that cannot be indexed, or a root that is not there."""


@dataclass
class IndexReport:
    root: str  # the root's name: its documents are corpus://<root>/...
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    ignored: Counter[str] = field(default_factory=Counter)  # files of other types, by extension
    embedded: int = 0  # documents given vectors, from this root or others
    reembedded: str = ""  # why every document was embedded again, if it was


@dataclass(frozen=True)
class Root:
    name: str
    folder: Path | None  # None for the legacy root
    documents: int
    indexed_at: float | None  # seconds since the epoch; None for the legacy root


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


@dataclass(frozen=True)
class EmbeddingStatus:
    model: str | None  # the model the index's vectors come from; None when it has none
    dimensions: int | None
    documents: int
    embedded: int  # documents with vectors


@dataclass(frozen=True)
class _Matrix:
    """Every passage vector of one vectors_version, in memory: a search is one matrix product."""

    version: str
    vectors: Vectors  # one row per passage, ordered by document, then start
    starts: npt.NDArray[np.int64]  # each passage's start in its document's text
    docs: npt.NDArray[np.int64]  # each document once, in the rows' order
    first: npt.NDArray[np.int64]  # the row of each document's first passage


class _VectorsUnusable(Exception):
    """The index's vectors cannot answer this query; the message says why, for the reader."""


def _plain_title(text: str, file: Path) -> str:
    """A Markdown document's first heading, else the file name."""
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return file.stem.replace("-", " ").replace("_", " ")


def _match_expression(query: str) -> str:
    """Free text as an FTS5 query: every word quoted (no syntax errors), any word may match. Common words
    are left out when others remain: a document that has only those is no match, whatever its rank."""
    words = [word.replace('"', '""') for word in query.split()]
    content = [word for word in words if word.lower().strip(".,;:!?'\"()") not in _COMMON_WORDS]
    return " OR ".join(f'"{word}"' for word in content or words)


def _is_binary(body: bytes) -> bool:
    """Whether a file's first bytes are not text: a NUL, or over a tenth undecodable or control characters."""
    sample = body[:SNIFF_BYTES]
    if b"\0" in sample:
        return True
    text = sample.decode("utf-8", errors="replace")
    odd = sum(1 for char in text if char == "\ufffd" or (char < " " and char not in "\t\n\r\f\v\b"))
    return odd * 10 > len(text)


def _content_hash(title: str, text: str) -> str:
    return hashlib.sha256(f"{title}\0{text}".encode()).hexdigest()


def _passages(title: str, text: str) -> list[tuple[int, str]]:
    """(where it starts, what is embedded) for each piece of about PASSAGE_CHARS of the text, cut at
    whitespace, with the title, which says what the piece is about. A text without words: its title."""
    passages = []
    start = 0
    while start < len(text):
        end = min(len(text), start + PASSAGE_CHARS)
        if end < len(text):
            cut = max(
                text.rfind(" ", start + PASSAGE_CHARS // 2, end), text.rfind("\n", start + PASSAGE_CHARS // 2, end)
            )
            end = cut if cut > start else end
        if text[start:end].strip():
            passages.append((start, f"{title}\n\n{text[start:end].strip()}"))
        start = end
    return passages or [(0, title or "(no text)")]


def _stem(word: str) -> str:
    """A word less its commonest English endings, so that `towers` finds `tower` (a little of what porter does)."""
    word = word.lower()
    for ending in ("ing", "ed", "es", "s"):
        if word.endswith(ending) and len(word) - len(ending) >= 3:
            return word[: -len(ending)]
    return word


def _snippet(text: str, query: str, passage: int | None) -> str:
    """About SNIPPET_CHARS of the text where the most of the query's words occur together; where none
    does, the passage the vectors matched, else the beginning. Whitespace collapsed, cuts marked."""
    if len(text) <= SNIPPET_CHARS:
        return " ".join(text.split())
    words = [word.lower() for word in re.findall(r"\w+", query)]
    stems = {_stem(word) for word in ([word for word in words if word not in _COMMON_WORDS] or words)}
    begin = passage or 0
    if stems:
        alternatives = "|".join(re.escape(stem) for stem in sorted(stems, key=len, reverse=True))
        # Lower case is the text's own length but for a few letters, and is searched twice as fast as IGNORECASE.
        pattern = re.compile(rf"\b({alternatives})")
        found = [(match.start(), match.group(1)) for match in islice(pattern.finditer(text.lower()), SNIPPET_MATCHES)]
        best_count, end = 0, 0
        for index, (position, _) in enumerate(found):
            while end < len(found) and found[end][0] < position + SNIPPET_CHARS * 4 // 5:
                end += 1
            count = len({stem for _, stem in found[index:end]})
            if count > best_count:
                best_count, begin = count, max(0, position - SNIPPET_CHARS // 5)
    begin = min(begin, len(text) - SNIPPET_CHARS)
    if begin > 0:  # start at a word
        space = re.compile(r"\s").search(text, begin, begin + 30)
        begin = space.end() if space else begin
    end = begin + SNIPPET_CHARS
    if end < len(text):  # and end at one
        space_at = max(text.rfind(" ", end - 30, end), text.rfind("\n", end - 30, end))
        end = space_at if space_at > begin else end
    piece = " ".join(text[begin:end].split())
    return ("… " if begin > 0 else "") + piece + (" …" if end < len(text) else "")


def _space(model: str | None, dimensions: int | None) -> str:
    """Which vectors, in words: `64-dimensional vectors from 'model'`."""
    return f"{'' if dimensions is None else f'{dimensions}-dimensional '}vectors from {model!r}"


def _meta(connection: sqlite3.Connection) -> dict[str, str]:
    return dict(connection.execute("SELECT name, value FROM meta").fetchall())


def _set_meta(connection: sqlite3.Connection, name: str, value: object | None) -> None:
    if value is None:
        connection.execute("DELETE FROM meta WHERE name = ?", (name,))
    else:
        connection.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, str(value)))


def _upgrade_v0(connection: sqlite3.Connection) -> None:
    tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "files" in tables:
        connection.execute("ALTER TABLE files RENAME TO files_v0")
    for statement in _SCHEMA_V1:
        connection.execute(statement)
    if "files" in tables:
        # The folder it held was never recorded: its documents keep their URLs under a root of their own.
        if connection.execute("SELECT 1 FROM files_v0 LIMIT 1").fetchone():
            connection.execute("INSERT INTO roots (name) VALUES (?)", (LEGACY_ROOT,))
            connection.execute(
                "INSERT INTO files (key, root, path, size, mtime)"
                " SELECT path, (SELECT id FROM roots), path, size, mtime FROM files_v0"
            )
        connection.execute("DROP TABLE files_v0")


def _upgrade_v1(connection: sqlite3.Connection) -> None:
    for statement in _SCHEMA_V2:
        connection.execute(statement)
    for rowid, path, title, text in connection.execute("SELECT rowid, path, title, text FROM documents"):
        connection.execute(
            "UPDATE files SET doc = ?, hash = ? WHERE key = ?", (rowid, _content_hash(title, text), path)
        )


def _upgrade(connection: sqlite3.Connection, index_path: Path) -> None:
    """Bring the schema to SCHEMA_VERSION, keeping what an older index holds."""
    (version,) = connection.execute("PRAGMA user_version").fetchone()
    if version == SCHEMA_VERSION:
        return
    if version < SCHEMA_VERSION:
        # Searches read the last committed index while an indexing transaction, embeddings and all, runs.
        connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("BEGIN IMMEDIATE")
    try:
        (version,) = connection.execute("PRAGMA user_version").fetchone()  # another process may have upgraded it
        if version > SCHEMA_VERSION:
            raise CorpusError(
                f"{index_path} has corpus schema {version}, newer than this Quarry's {SCHEMA_VERSION}; upgrade Quarry"
            )
        if version == 0:
            _upgrade_v0(connection)
        if version <= 1:
            _upgrade_v1(connection)
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise


def _free_name(connection: sqlite3.Connection, folder: Path) -> str:
    """The folder's name, suffixed until no root has it and no document's URL starts with it."""
    base = name = folder.name or "root"
    number = 1
    while connection.execute(
        "SELECT 1 FROM roots WHERE name = ? UNION ALL SELECT 1 FROM files WHERE substr(key, 1, ?) = ?",
        (name, len(name) + 1, name + "/"),
    ).fetchone():
        number += 1
        name = f"{base}-{number}"
    return name


def _drop_documents(connection: sqlite3.Connection, docs: Sequence[int]) -> None:
    connection.executemany("DELETE FROM documents WHERE rowid = ?", [(doc,) for doc in docs])
    connection.executemany("DELETE FROM vectors WHERE doc = ?", [(doc,) for doc in docs])


class Corpus:
    def __init__(self, index_path: Path, embedder: Embedder | None = None) -> None:
        self.index_path = index_path
        # Without one, indexing writes no vectors and search is BM25 alone.
        self.embedder = embedder
        self._matrix: _Matrix | None = None
        self._matrix_lock = threading.Lock()

    @contextmanager
    def _connect(self, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection to the upgraded index; with write, inside one transaction."""
        self.index_path.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(self.index_path, isolation_level=None)) as connection:
            _upgrade(connection, self.index_path)
            if not write:
                yield connection
                return
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

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
            row = connection.execute("SELECT id, name FROM roots WHERE folder = ?", (str(folder),)).fetchone()
            if row is None:
                name = _free_name(connection, folder)
                root = connection.execute(
                    "INSERT INTO roots (folder, name) VALUES (?, ?) RETURNING id", (str(folder), name)
                ).fetchone()[0]
            else:
                root, name = row
            report = IndexReport(root=name)
            known: dict[str, tuple[int, float, int | None, str | None]] = {
                path: (size, mtime, doc, digest)
                for path, size, mtime, doc, digest in connection.execute(
                    "SELECT path, size, mtime, doc, hash FROM files WHERE root = ?", (root,)
                )
            }
            seen: set[str] = set()
            for file in sorted(folder.rglob("*")):
                if not file.is_file():
                    continue
                relative = file.relative_to(folder).as_posix()
                if file.suffix.lower() not in CONTENT_TYPES:
                    report.ignored[file.suffix.lower() or "(none)"] += 1
                    continue
                before = known.get(relative)
                try:
                    stat = file.stat()
                    if before is not None and before[:2] == (stat.st_size, stat.st_mtime):
                        report.unchanged += 1
                        seen.add(relative)
                        continue
                    why = self._index_file(connection, root, f"{name}/{relative}", file, relative, stat, before)
                except OSError as error:
                    why = f"cannot be read: {error.strerror or error}"
                if why is not None:
                    # Not seen: a document indexed from an earlier version of the file leaves the index.
                    report.skipped.append((relative, why))
                    continue
                (report.updated if before is not None else report.added).append(relative)
                seen.add(relative)
            for gone in sorted(set(known) - seen):
                doc = known[gone][2]
                _drop_documents(connection, [] if doc is None else [doc])
                connection.execute("DELETE FROM files WHERE root = ? AND path = ?", (root, gone))
                report.removed.append(gone)
            if self.embedder is not None:
                try:
                    report.embedded, report.reembedded = self._embed_missing(
                        connection, self.embedder, reembed, progress
                    )
                except EmbeddingError as error:
                    raise CorpusError(f"{error}; nothing was written: the index is as it was") from error
            _set_meta(connection, "vectors_version", os.urandom(8).hex())
            connection.execute("UPDATE roots SET indexed_at = ? WHERE id = ?", (time.time(), root))
        return report

    def _index_file(
        self,
        connection: sqlite3.Connection,
        root: int,
        key: str,
        file: Path,
        relative: str,
        stat: os.stat_result,
        before: tuple[int, float, int | None, str | None] | None,
    ) -> str | None:
        """Index one changed file; None when done, else why it was skipped."""
        if stat.st_size > MAX_FILE_BYTES:
            return f"larger than {MAX_FILE_BYTES} bytes"
        body = file.read_bytes()
        content_type = CONTENT_TYPES[file.suffix.lower()]
        # Whatever the extension says: a PDF is extracted as one, and anything else must be text.
        if not body.startswith(b"%PDF-") and content_type != "application/pdf" and _is_binary(body):
            return "binary content, not text"
        try:
            title, text = extract(SCHEME + key, content_type, body)
        except PageError as error:
            return str(error)
        if title == SCHEME + key:
            title = _plain_title(text, file)
        digest = _content_hash(title, text)
        doc = None if before is None else before[2]
        if doc is None:
            doc = connection.execute(
                "INSERT INTO documents (path, title, text) VALUES (?, ?, ?)", (key, title, text)
            ).lastrowid
        else:  # the same rowid, so its vectors stay its own
            connection.execute("DELETE FROM documents WHERE rowid = ?", (doc,))
            connection.execute(
                "INSERT INTO documents (rowid, path, title, text) VALUES (?, ?, ?, ?)", (doc, key, title, text)
            )
            if before is not None and before[3] != digest:
                connection.execute("DELETE FROM vectors WHERE doc = ?", (doc,))
        connection.execute(
            "INSERT OR REPLACE INTO files (key, root, path, size, mtime, doc, hash) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key, root, relative, stat.st_size, stat.st_mtime, doc, digest),
        )
        return None

    def _embed_missing(
        self,
        connection: sqlite3.Connection,
        embedder: Embedder,
        reembed: bool,
        progress: Callable[[int, int], None] | None,
    ) -> tuple[int, str]:
        """Vectors for every document without them, in batches; returns how many documents, and why all
        were embedded again if they were. Raises EmbeddingError, the transaction's to roll back."""
        meta = _meta(connection)
        model, wanted = meta.get("embedding_model"), embedder.settings
        dimensions = int(meta["embedding_dimensions"]) if "embedding_dimensions" in meta else None
        reembedded = ""
        if reembed or model != wanted.model or wanted.dimensions not in (None, dimensions):
            if connection.execute("SELECT 1 FROM vectors LIMIT 1").fetchone():
                reembedded = (
                    "asked to"
                    if reembed
                    else f"the index held {_space(model, dimensions)}, not {_space(wanted.model, wanted.dimensions)}"
                )
            connection.execute("DELETE FROM vectors")
            _set_meta(connection, "embedding_model", wanted.model)
            dimensions = wanted.dimensions
        todo = connection.execute(
            "SELECT doc FROM files WHERE doc IS NOT NULL"
            " AND NOT EXISTS (SELECT 1 FROM vectors WHERE vectors.doc = files.doc) ORDER BY key"
        ).fetchall()
        batch: list[tuple[int, int, str]] = []  # (doc, start, text)
        queued = 0  # documents whose every passage is in a batch

        def flush() -> None:
            nonlocal dimensions
            vectors = embedder.embed([text for _, _, text in batch])
            if dimensions is None:
                dimensions = vectors.shape[1]
            elif vectors.shape[1] != dimensions:
                raise EmbeddingError(
                    f"{wanted.model!r} answered {vectors.shape[1]}-dimensional vectors, but the index holds "
                    f"{dimensions}-dimensional ones from it; `quarry corpus index --reembed` computes them all again"
                )
            connection.executemany(
                "INSERT INTO vectors (doc, start, vector) VALUES (?, ?, ?)",
                [
                    (doc, start, vector.astype("<f4").tobytes())
                    for (doc, start, _), vector in zip(batch, vectors, strict=True)
                ],
            )
            batch.clear()
            if progress is not None:
                progress(queued, len(todo))

        for (doc,) in todo:
            title, text = connection.execute("SELECT title, text FROM documents WHERE rowid = ?", (doc,)).fetchone()
            for start, passage in _passages(title, text):
                if len(batch) == wanted.batch_size:
                    flush()
                batch.append((doc, start, passage))
            queued += 1
        if batch:
            flush()
        _set_meta(connection, "embedding_dimensions", dimensions)
        return len(todo), reembedded

    def roots(self) -> list[Root]:
        """Every root, by name, with its document count."""
        with self._connect() as connection:
            rows = connection.execute(
                "SELECT name, folder, (SELECT count(*) FROM files WHERE root = roots.id), indexed_at"
                " FROM roots ORDER BY name"
            ).fetchall()
        return [
            Root(name=name, folder=None if folder is None else Path(folder), documents=count, indexed_at=indexed_at)
            for name, folder, count, indexed_at in rows
        ]

    def embedding_status(self) -> EmbeddingStatus:
        """Which model the index's vectors are from, and how many documents have them."""
        with self._connect() as connection:
            meta = _meta(connection)
            (documents,) = connection.execute("SELECT count(*) FROM files").fetchone()
            (embedded,) = connection.execute("SELECT count(DISTINCT doc) FROM vectors").fetchone()
        dimensions = meta.get("embedding_dimensions")
        return EmbeddingStatus(
            model=meta.get("embedding_model") if embedded else None,
            dimensions=int(dimensions) if dimensions and embedded else None,
            documents=documents,
            embedded=embedded,
        )

    def remove_root(self, which: str) -> Root:
        """Drop a root, named by its folder or its name, and its documents; returns what it was."""
        with self._connect(write=True) as connection:
            folder = str(Path(which).resolve())
            row = connection.execute(
                "SELECT id, name, folder, indexed_at FROM roots WHERE folder = ? OR name = ?"
                " ORDER BY folder = ? DESC LIMIT 1",  # the folder first: a relative path may look like a name
                (folder, which, folder),
            ).fetchone()
            if row is None:
                known = [name for (name,) in connection.execute("SELECT name FROM roots ORDER BY name")]
                raise CorpusError(
                    f"no root {which!r} in {self.index_path}; roots: {', '.join(known) or 'none'}"
                    " (a folder, or a name from `quarry corpus list`)"
                )
            root, name, folder, indexed_at = row
            docs = [
                doc
                for (doc,) in connection.execute("SELECT doc FROM files WHERE root = ? AND doc IS NOT NULL", (root,))
            ]
            _drop_documents(connection, docs)
            count = connection.execute("DELETE FROM files WHERE root = ?", (root,)).rowcount
            connection.execute("DELETE FROM roots WHERE id = ?", (root,))
            _set_meta(connection, "vectors_version", os.urandom(8).hex())
        return Root(name=name, folder=None if folder is None else Path(folder), documents=count, indexed_at=indexed_at)

    def document_count(self) -> int:
        """How many documents the index holds, read without creating or upgrading it (blocking).

        Raises CorpusError when there is no index, or the file is not one."""
        if not self.index_path.is_file():
            raise CorpusError(f"there is no index at {self.index_path}")
        try:
            with closing(sqlite3.connect(self.index_path.resolve().as_uri() + "?mode=ro", uri=True)) as connection:
                (count,) = connection.execute("SELECT count(*) FROM documents").fetchone()
        except sqlite3.Error as error:
            raise CorpusError(f"{self.index_path} is not a corpus index: {error}") from None
        return int(count)

    def retrieve(self, query: str, limit: int) -> Retrieval:
        """The best `limit` documents for the query, with snippets, and how they were found (blocking)."""
        expression = _match_expression(query)
        if not expression:
            return Retrieval([], "bm25")
        with self._connect() as connection:
            # One snapshot: the documents, the vectors and their version agree whatever an indexing commits.
            connection.execute("BEGIN")
            try:
                return self._retrieve(connection, expression, query, limit)
            finally:
                connection.execute("COMMIT")

    def _retrieve(self, connection: sqlite3.Connection, expression: str, query: str, limit: int) -> Retrieval:
        depth = limit if self.embedder is None else max(limit, FUSION_DEPTH)
        lexical = [
            doc
            for (doc,) in connection.execute(
                "SELECT rowid FROM documents WHERE documents MATCH ? ORDER BY rank LIMIT ?", (expression, depth)
            )
        ]
        if self.embedder is None:
            return Retrieval(self._hits(connection, lexical[:limit], query, {}), "bm25")
        try:
            nearest = self._nearest(connection, self.embedder, query, depth)
        except (_VectorsUnusable, EmbeddingError) as error:
            log.warning("corpus search fell back to BM25 alone: %s", error)
            return Retrieval(self._hits(connection, lexical[:limit], query, {}), "bm25", str(error))
        fused = reciprocal_rank_fusion([lexical, list(nearest)])[:limit]
        return Retrieval(self._hits(connection, fused, query, nearest), "hybrid")

    def _nearest(self, connection: sqlite3.Connection, embedder: Embedder, query: str, depth: int) -> dict[int, int]:
        """The `depth` documents whose passages are nearest the query, best first, each with its best
        passage's start. Raises _VectorsUnusable or EmbeddingError."""
        meta = _meta(connection)
        model, stored = meta.get("embedding_model"), meta.get("embedding_dimensions")
        wanted = embedder.settings
        if model is None or stored is None or not connection.execute("SELECT 1 FROM vectors LIMIT 1").fetchone():
            raise _VectorsUnusable(
                f"the index holds no vectors; `quarry corpus index FOLDER` computes them with {wanted.model!r}"
            )
        dimensions = int(stored)
        if model != wanted.model or wanted.dimensions not in (None, dimensions):
            raise _VectorsUnusable(
                f"the index holds {_space(model, dimensions)}, but the embeddings configured are "
                f"{_space(wanted.model, wanted.dimensions)}; "
                "`quarry corpus index --reembed FOLDER` computes them again"
            )
        query_vector = embedder.embed([query])[0]
        if query_vector.shape[0] != dimensions:
            raise _VectorsUnusable(
                f"{wanted.model!r} answered a {query_vector.shape[0]}-dimensional vector for the query, but the "
                f"index holds {dimensions}-dimensional ones; `quarry corpus index --reembed FOLDER` computes them again"
            )
        matrix = self._load_matrix(connection, meta.get("vectors_version", ""), dimensions)
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

    def _load_matrix(self, connection: sqlite3.Connection, version: str, dimensions: int) -> _Matrix:
        """The index's vectors, read again only when an indexing has changed them since."""
        with self._matrix_lock:
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

    def _hits(self, connection: sqlite3.Connection, docs: list[int], query: str, passages: dict[int, int]) -> list[Hit]:
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
                    result=SearchResult(
                        title=title, url=SCHEME + key, snippet=_snippet(text, query, passages.get(doc))
                    ),
                    file=None if folder is None else Path(folder) / relative,
                )
            )
        return hits

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        """Best matches first: BM25 and vectors fused, or BM25 alone (with a notice when it fell back)."""
        retrieval = await asyncio.to_thread(self.retrieve, query, limit)
        notice = f"Keyword (BM25) search only: {retrieval.notice}." if retrieval.notice else ""
        return SearchResults((hit.result for hit in retrieval.hits), notice=notice)

    def _read(self, url: str) -> tuple[str, str]:
        key = url.removeprefix(SCHEME)
        with self._connect() as connection:
            row = connection.execute(
                "SELECT title, text FROM documents WHERE rowid = (SELECT doc FROM files WHERE key = ?)", (key,)
            ).fetchone()
        if row is None:
            raise PageError(f"{url} is not in the corpus")
        return str(row[0]), str(row[1])

    async def read(self, url: str) -> tuple[str, str]:
        """(title, text) of an indexed document."""
        return await asyncio.to_thread(self._read, url)
