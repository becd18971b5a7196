"""Folders in the index, as roots: each added, brought in line with its folder, listed and removed on its own.

Indexing a root is incremental and touches only that root: unchanged files (same size and
modification time) are skipped, and files gone from the folder leave the index; other roots stay
as they are until removed. The text is committed first. With an embedder, the vectors every document
lacks are computed after it, and committed a batch of whole documents at a time: an indexing stopped
anywhere (a failure, Ctrl-C, a crash) keeps what it committed, and the next one goes on from there.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from worker_svc.corpus.embeddings import Embedder, EmbeddingError
from worker_svc.corpus.schema import SCHEME, CorpusError, bump_vectors_version
from worker_svc.corpus.text import content_hash, is_binary, plain_title
from worker_svc.corpus.vectors import embed_missing
from worker_svc.web.pages import PageError, extract

CONTENT_TYPES = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".txt": "text/plain",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
}
MAX_FILE_BYTES = 50 * 1024 * 1024

# A file as indexed: (size, mtime, its document's rowid, its text's hash).
_Indexed = tuple[int, float, int | None, str | None]


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
    not_embedded: list[tuple[str, str]] = field(default_factory=list)  # (document URL, why): the next run retries
    embedded_share: float = 1.0  # of the embedded documents' text, how much is in some passage


@dataclass(frozen=True)
class Root:
    name: str
    folder: Path | None  # None for the legacy root
    documents: int
    indexed_at: float | None  # seconds since the epoch; None for the legacy root


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


def index_folder(
    connection: sqlite3.Connection,
    folder: Path,
    embedder: Embedder | None,
    reembed: bool,
    progress: Callable[[int, int], None] | None,
) -> IndexReport:
    """Add the resolved folder as a root, or bring its root in line with it, inside the connection's
    transaction; then the vectors every document lacks, with an embedder."""
    row = connection.execute("SELECT id, name FROM roots WHERE folder = ?", (str(folder),)).fetchone()
    if row is None:
        name = _free_name(connection, folder)
        root = connection.execute(
            "INSERT INTO roots (folder, name) VALUES (?, ?) RETURNING id", (str(folder), name)
        ).fetchone()[0]
    else:
        root, name = row
    report = IndexReport(root=name)
    known: dict[str, _Indexed] = {
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
            why = _index_file(connection, root, f"{name}/{relative}", file, relative, stat, before)
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
    connection.execute("UPDATE roots SET indexed_at = ? WHERE id = ?", (time.time(), root))

    def commit() -> None:
        bump_vectors_version(connection)
        connection.execute("COMMIT")
        connection.execute("BEGIN IMMEDIATE")

    commit()  # the text, whatever the embeddings do
    if embedder is not None:
        try:
            embedded = embed_missing(connection, embedder, reembed, progress, commit)
        except EmbeddingError as error:
            raise CorpusError(
                f"{error}. The text is indexed and the vectors computed before this are kept: "
                "`quarry corpus index` again goes on from there"
            ) from error
        report.embedded, report.reembedded = embedded.documents, embedded.reembedded
        report.embedded_share = embedded.share
        keys = dict(connection.execute("SELECT doc, key FROM files WHERE doc IS NOT NULL"))
        report.not_embedded = [(SCHEME + keys.get(doc, str(doc)), why) for doc, why in embedded.failed]
    return report


def _index_file(
    connection: sqlite3.Connection,
    root: int,
    key: str,
    file: Path,
    relative: str,
    stat: os.stat_result,
    before: _Indexed | None,
) -> str | None:
    """Index one changed file; None when done, else why it was skipped."""
    if stat.st_size > MAX_FILE_BYTES:
        return f"larger than {MAX_FILE_BYTES} bytes"
    if stat.st_size == 0:
        return "empty"
    body = file.read_bytes()
    content_type = CONTENT_TYPES[file.suffix.lower()]
    # Whatever the extension says: a PDF is extracted as one, and anything else must be text.
    if not body.startswith(b"%PDF-") and content_type != "application/pdf" and is_binary(body):
        return "binary content, not text"
    try:
        title, text = extract(SCHEME + key, content_type, body)
    except PageError as error:
        return str(error)
    if not text.strip():
        return "no text in it"
    if title == SCHEME + key:  # none in the document: a text's first Markdown heading, else the file's name
        pdf = body.startswith(b"%PDF-") or content_type == "application/pdf"
        title = plain_title("" if pdf else text, file)
    digest = content_hash(title, text)
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


def roots(connection: sqlite3.Connection) -> list[Root]:
    """Every root, by name, with its document count."""
    rows = connection.execute(
        "SELECT name, folder, (SELECT count(*) FROM files WHERE root = roots.id), indexed_at FROM roots ORDER BY name"
    ).fetchall()
    return [
        Root(name=name, folder=None if folder is None else Path(folder), documents=count, indexed_at=indexed_at)
        for name, folder, count, indexed_at in rows
    ]


def remove_root(connection: sqlite3.Connection, which: str, index_path: Path) -> Root:
    """Drop a root, named by its folder or its name, and its documents, inside the connection's
    transaction; returns what it was."""
    folder = str(Path(which).resolve())
    row = connection.execute(
        "SELECT id, name, folder, indexed_at FROM roots WHERE folder = ? OR name = ?"
        " ORDER BY folder = ? DESC LIMIT 1",  # the folder first: a relative path may look like a name
        (folder, which, folder),
    ).fetchone()
    if row is None:
        known = [name for (name,) in connection.execute("SELECT name FROM roots ORDER BY name")]
        raise CorpusError(
            f"no root {which!r} in {index_path}; roots: {', '.join(known) or 'none'}"
            " (a folder, or a name from `quarry corpus list`)"
        )
    root, name, folder, indexed_at = row
    docs = [doc for (doc,) in connection.execute("SELECT doc FROM files WHERE root = ? AND doc IS NOT NULL", (root,))]
    _drop_documents(connection, docs)
    count = connection.execute("DELETE FROM files WHERE root = ?", (root,)).rowcount
    connection.execute("DELETE FROM roots WHERE id = ?", (root,))
    bump_vectors_version(connection)
    return Root(name=name, folder=None if folder is None else Path(folder), documents=count, indexed_at=indexed_at)
