"""The index file: its schema, the upgrades that bring an older index to it, its metadata, and connections.

Version 2 (PRAGMA user_version): vectors, and each file's document rowid and text hash.
Version 1: several roots. Version 0, one unrecorded folder, had `files (path PRIMARY KEY,
size, mtime)` and the same `documents` table.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from worker_svc.corpus.text import content_hash

# Documents are cited as corpus://<root name>/<path relative to the folder>: their key in the index.
SCHEME = "corpus://"
# The name of the root that holds what an index written before roots were tracked held.
LEGACY_ROOT = "legacy"

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


def meta(connection: sqlite3.Connection) -> dict[str, str]:
    return dict(connection.execute("SELECT name, value FROM meta").fetchall())


def set_meta(connection: sqlite3.Connection, name: str, value: object | None) -> None:
    if value is None:
        connection.execute("DELETE FROM meta WHERE name = ?", (name,))
    else:
        connection.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, str(value)))


def bump_vectors_version(connection: sqlite3.Connection) -> None:
    """Tell every search's in-memory vectors that the index's have changed."""
    set_meta(connection, "vectors_version", os.urandom(8).hex())


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
        connection.execute("UPDATE files SET doc = ?, hash = ? WHERE key = ?", (rowid, content_hash(title, text), path))


def upgrade(connection: sqlite3.Connection, index_path: Path) -> None:
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


@contextmanager
def connect(index_path: Path, *, write: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection to the upgraded index; with write, inside one transaction."""
    index_path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(index_path, isolation_level=None)) as connection:
        upgrade(connection, index_path)
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


def document_count(index_path: Path) -> int:
    """How many documents the index holds, read without creating or upgrading it (blocking).

    Raises CorpusError when there is no index, or the file is not one."""
    if not index_path.is_file():
        raise CorpusError(f"there is no index at {index_path}")
    try:
        with closing(sqlite3.connect(index_path.resolve().as_uri() + "?mode=ro", uri=True)) as connection:
            (count,) = connection.execute("SELECT count(*) FROM documents").fetchone()
    except sqlite3.Error as error:
        raise CorpusError(f"{index_path} is not a corpus index: {error}") from None
    return int(count)
