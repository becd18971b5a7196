"""The local document corpus: folders of Markdown, HTML, text and PDF, indexed with SQLite FTS5.

Each indexed folder is a root with a name (its folder's name, made unique), and
its documents are cited as `corpus://<root name>/<path relative to the folder>`,
read from the index by the same page tools as the web, so local and web sources
are verified the same way. Indexing a root is incremental and touches only that
root: unchanged files (same size and modification time) are skipped, and files
gone from the folder leave the index; other roots stay as they are until removed.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from worker_svc.web.pages import PageError, extract
from worker_svc.web.search import SearchResult

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

# Version 1 (PRAGMA user_version): several roots. Version 0, one unrecorded folder, had
# `files (path PRIMARY KEY, size, mtime)` and the same `documents` table.
SCHEMA_VERSION = 1
_SCHEMA_V1 = (
    # folder is NULL for the legacy root, whose folder was never recorded.
    "CREATE TABLE roots (id INTEGER PRIMARY KEY, folder TEXT UNIQUE, name TEXT NOT NULL UNIQUE, indexed_at REAL)",
    # key: the document's path in `documents`, its URL without the scheme.
    "CREATE TABLE files (key TEXT PRIMARY KEY, root INTEGER NOT NULL REFERENCES roots (id), path TEXT NOT NULL,"
    " size INTEGER NOT NULL, mtime REAL NOT NULL, UNIQUE (root, path))",
    "CREATE VIRTUAL TABLE IF NOT EXISTS documents USING fts5(path UNINDEXED, title, text, tokenize='porter unicode61')",
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


def _plain_title(text: str, file: Path) -> str:
    """A Markdown document's first heading, else the file name."""
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return file.stem.replace("-", " ").replace("_", " ")


def _match_expression(query: str) -> str:
    """Free text as an FTS5 query: every word quoted (no syntax errors), any word may match."""
    words = [word.replace('"', '""') for word in query.split()]
    return " OR ".join(f'"{word}"' for word in words)


def _is_binary(body: bytes) -> bool:
    """Whether a file's first bytes are not text: a NUL, or over a tenth undecodable or control characters."""
    sample = body[:SNIFF_BYTES]
    if b"\0" in sample:
        return True
    text = sample.decode("utf-8", errors="replace")
    odd = sum(1 for char in text if char == "\ufffd" or (char < " " and char not in "\t\n\r\f\v\b"))
    return odd * 10 > len(text)


def _upgrade(connection: sqlite3.Connection, index_path: Path) -> None:
    """Bring the schema to SCHEMA_VERSION, keeping what an older index holds."""
    (version,) = connection.execute("PRAGMA user_version").fetchone()
    if version == SCHEMA_VERSION:
        return
    connection.execute("BEGIN IMMEDIATE")
    try:
        (version,) = connection.execute("PRAGMA user_version").fetchone()  # another process may have upgraded it
        if version > SCHEMA_VERSION:
            raise CorpusError(
                f"{index_path} has corpus schema {version}, newer than this Quarry's {SCHEMA_VERSION}; upgrade Quarry"
            )
        if version == 0:
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


class Corpus:
    def __init__(self, index_path: Path) -> None:
        self.index_path = index_path

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

    def index_folder(self, folder: Path) -> IndexReport:
        """Add the folder as a root, or bring its root in line with it; other roots are left alone (blocking)."""
        folder = folder.resolve()
        if not folder.is_dir():
            raise CorpusError(f"{folder} is not a folder")
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
            known = {
                path: (size, mtime)
                for path, size, mtime in connection.execute(
                    "SELECT path, size, mtime FROM files WHERE root = ?", (root,)
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
                try:
                    stat = file.stat()
                    if known.get(relative) == (stat.st_size, stat.st_mtime):
                        report.unchanged += 1
                        seen.add(relative)
                        continue
                    why = self._index_file(connection, root, f"{name}/{relative}", file, relative, stat)
                except OSError as error:
                    why = f"cannot be read: {error.strerror or error}"
                if why is not None:
                    # Not seen: a document indexed from an earlier version of the file leaves the index.
                    report.skipped.append((relative, why))
                    continue
                (report.updated if relative in known else report.added).append(relative)
                seen.add(relative)
            for gone in sorted(set(known) - seen):
                connection.execute("DELETE FROM documents WHERE path = ?", (f"{name}/{gone}",))
                connection.execute("DELETE FROM files WHERE root = ? AND path = ?", (root, gone))
                report.removed.append(gone)
            connection.execute("UPDATE roots SET indexed_at = ? WHERE id = ?", (time.time(), root))
        return report

    def _index_file(
        self, connection: sqlite3.Connection, root: int, key: str, file: Path, relative: str, stat: os.stat_result
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
        connection.execute("DELETE FROM documents WHERE path = ?", (key,))
        connection.execute("INSERT INTO documents (path, title, text) VALUES (?, ?, ?)", (key, title, text))
        connection.execute(
            "INSERT OR REPLACE INTO files (key, root, path, size, mtime) VALUES (?, ?, ?, ?, ?)",
            (key, root, relative, stat.st_size, stat.st_mtime),
        )
        return None

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
            connection.execute("DELETE FROM documents WHERE path IN (SELECT key FROM files WHERE root = ?)", (root,))
            count = connection.execute("DELETE FROM files WHERE root = ?", (root,)).rowcount
            connection.execute("DELETE FROM roots WHERE id = ?", (root,))
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

    def hits(self, query: str, limit: int) -> list[Hit]:
        """Best matches first (bm25), with the file each was read from (blocking)."""
        expression = _match_expression(query)
        if not expression:
            return []
        with self._connect() as connection:
            rows = connection.execute(
                "SELECT path, title, snippet(documents, 2, '', '', ' … ', 24) FROM documents"
                " WHERE documents MATCH ? ORDER BY bm25(documents) LIMIT ?",
                (expression, limit),
            ).fetchall()
            files = {
                key: (folder, path)
                for key, folder, path in connection.execute(
                    "SELECT key, folder, path FROM files JOIN roots ON roots.id = files.root"
                    f" WHERE key IN ({', '.join('?' * len(rows))})",
                    [key for key, _, _ in rows],
                )
            }
        hits = []
        for key, title, snippet in rows:
            folder, relative = files.get(key, (None, ""))
            hits.append(
                Hit(
                    result=SearchResult(title=title, url=SCHEME + key, snippet=snippet),
                    file=None if folder is None else Path(folder) / relative,
                )
            )
        return hits

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        """Best matches first (bm25)."""
        return [hit.result for hit in await asyncio.to_thread(self.hits, query, limit)]

    def _read(self, url: str) -> tuple[str, str]:
        path = url.removeprefix(SCHEME)
        with self._connect() as connection:
            row = connection.execute("SELECT title, text FROM documents WHERE path = ?", (path,)).fetchone()
        if row is None:
            raise PageError(f"{url} is not in the corpus")
        return str(row[0]), str(row[1])

    async def read(self, url: str) -> tuple[str, str]:
        """(title, text) of an indexed document."""
        return await asyncio.to_thread(self._read, url)
