"""The local document corpus: a folder of Markdown, HTML, text and PDF, indexed with SQLite FTS5.

Documents are cited as `corpus://<path relative to the folder>` and read from
the index by the same page tools as the web, so local and web sources are
verified the same way. Indexing is incremental: unchanged files (same size and
modification time) are skipped, and files gone from the folder leave the index.
"""

from __future__ import annotations

import asyncio
import sqlite3
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

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime REAL NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS documents USING fts5(path UNINDEXED, title, text, tokenize='porter unicode61');
"""


@dataclass
class IndexReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)


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


class Corpus:
    def __init__(self, index_path: Path) -> None:
        self.index_path = index_path

    def _connect(self) -> sqlite3.Connection:
        self.index_path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.index_path)
        connection.executescript(_SCHEMA)
        return connection

    def index_folder(self, folder: Path) -> IndexReport:
        """Bring the index in line with the folder (blocking)."""
        folder = folder.resolve()
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} is not a folder")
        report = IndexReport()
        with self._connect() as connection:
            known = {row[0]: (row[1], row[2]) for row in connection.execute("SELECT path, size, mtime FROM files")}
            seen: set[str] = set()
            for file in sorted(folder.rglob("*")):
                relative = file.relative_to(folder).as_posix()
                if not file.is_file() or file.suffix.lower() not in CONTENT_TYPES:
                    continue
                seen.add(relative)
                stat = file.stat()
                if known.get(relative) == (stat.st_size, stat.st_mtime):
                    report.unchanged += 1
                    continue
                if stat.st_size > MAX_FILE_BYTES:
                    report.skipped.append((relative, f"larger than {MAX_FILE_BYTES} bytes"))
                    continue
                try:
                    title, text = extract(SCHEME + relative, CONTENT_TYPES[file.suffix.lower()], file.read_bytes())
                except PageError as error:
                    report.skipped.append((relative, str(error)))
                    continue
                if title == SCHEME + relative:
                    title = _plain_title(text, file)
                connection.execute("DELETE FROM documents WHERE path = ?", (relative,))
                connection.execute(
                    "INSERT INTO documents (path, title, text) VALUES (?, ?, ?)", (relative, title, text)
                )
                connection.execute(
                    "INSERT OR REPLACE INTO files (path, size, mtime) VALUES (?, ?, ?)",
                    (relative, stat.st_size, stat.st_mtime),
                )
                (report.updated if relative in known else report.added).append(relative)
            for gone in sorted(set(known) - seen):
                connection.execute("DELETE FROM documents WHERE path = ?", (gone,))
                connection.execute("DELETE FROM files WHERE path = ?", (gone,))
                report.removed.append(gone)
        return report

    def _search(self, query: str, limit: int) -> list[SearchResult]:
        expression = _match_expression(query)
        if not expression:
            return []
        with self._connect() as connection:
            rows = connection.execute(
                "SELECT path, title, snippet(documents, 2, '', '', ' … ', 24) FROM documents"
                " WHERE documents MATCH ? ORDER BY bm25(documents) LIMIT ?",
                (expression, limit),
            ).fetchall()
        return [SearchResult(title=title, url=SCHEME + path, snippet=snippet) for path, title, snippet in rows]

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        """Best matches first (bm25)."""
        return await asyncio.to_thread(self._search, query, limit)

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
