"""Indexes written by older Quarrys keep working, and one from a newer Quarry is refused."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from tests.fakes.openai_server import ScriptedModel
from tests.worker_svc.corpus.documents import embedder_for, write_documents, write_folder
from worker_svc.corpus import LEGACY_ROOT, Corpus, CorpusError


async def test_an_index_written_before_roots_keeps_working(tmp_path: Path) -> None:
    index = tmp_path / "corpus.db"
    with sqlite3.connect(index) as old:  # the schema every index had before roots were tracked
        old.executescript(
            "CREATE TABLE files (path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime REAL NOT NULL);"
            "CREATE VIRTUAL TABLE documents USING fts5(path UNINDEXED, title, text, tokenize='porter unicode61');"
            "INSERT INTO files VALUES ('docs/old.md', 10, 1.0);"
            "INSERT INTO documents VALUES ('docs/old.md', 'Old', 'Written before roots, about aqueducts.');"
        )
    old.close()
    corpus = Corpus(index)
    assert [r.url for r in await corpus.search("aqueducts", 5)] == ["corpus://docs/old.md"]
    assert (await corpus.read("corpus://docs/old.md"))[0] == "Old", "its URLs stay as they were"
    assert [(root.name, root.folder, root.documents, root.indexed_at) for root in corpus.roots()] == [
        (LEGACY_ROOT, None, 1, None)
    ]
    # A new root's URLs cannot collide with the old ones.
    write_folder(tmp_path / "docs")
    assert corpus.index_folder(tmp_path / "docs").root == "docs-2"
    assert {r.url for r in await corpus.search("aqueducts tower", 10)} == {
        "corpus://docs/old.md",
        "corpus://docs-2/eiffel.md",
        "corpus://docs-2/bridges.txt",
        "corpus://docs-2/report.pdf",
    }
    assert corpus.remove_root(LEGACY_ROOT).documents == 1
    assert await corpus.search("aqueducts", 5) == []


def test_an_index_from_a_newer_quarry_is_refused(tmp_path: Path) -> None:
    index = tmp_path / "corpus.db"
    with sqlite3.connect(index) as newer:
        newer.execute("PRAGMA user_version = 99")
    newer.close()
    with pytest.raises(CorpusError, match="schema 99, newer than"):
        Corpus(index).roots()


async def test_an_index_from_before_vectors_keeps_its_documents_and_gets_vectors(
    embeddings: ScriptedModel, tmp_path: Path
) -> None:
    index = tmp_path / "corpus.db"
    with sqlite3.connect(index) as old:  # schema 1: roots, files and documents
        old.executescript(
            "CREATE TABLE roots (id INTEGER PRIMARY KEY, folder TEXT UNIQUE, name TEXT NOT NULL UNIQUE,"
            " indexed_at REAL);"
            "CREATE TABLE files (key TEXT PRIMARY KEY, root INTEGER NOT NULL REFERENCES roots (id),"
            " path TEXT NOT NULL, size INTEGER NOT NULL, mtime REAL NOT NULL, UNIQUE (root, path));"
            "CREATE VIRTUAL TABLE documents USING fts5(path UNINDEXED, title, text, tokenize='porter unicode61');"
            f"INSERT INTO roots VALUES (1, '{tmp_path / 'old'}', 'old', 1.0);"
            "INSERT INTO files VALUES ('old/ships.md', 1, 'ships.md', 10, 1.0);"
            "INSERT INTO documents VALUES ('old/ships.md', 'Ships', 'A ship makes a voyage.');"
            "PRAGMA user_version = 1;"
        )
    old.close()
    corpus = Corpus(index, embedder_for(embeddings))
    assert (await corpus.read("corpus://old/ships.md"))[1] == "A ship makes a voyage."
    retrieval = await asyncio.to_thread(corpus.retrieve, "voyage", 5)
    assert [hit.result.url for hit in retrieval.hits] == ["corpus://old/ships.md"]
    assert retrieval.mode == "bm25" and "the index holds no vectors" in retrieval.notice
    report = await asyncio.to_thread(corpus.index_folder, write_documents(tmp_path / "docs"))
    assert report.embedded == 5, "the old root's document too"
    hits = (await asyncio.to_thread(corpus.retrieve, "vessel crossing", 5)).hits
    assert "corpus://old/ships.md" in [hit.result.url for hit in hits]
