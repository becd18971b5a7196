"""The local corpus: roots indexed incrementally into FTS5, bm25 search, corpus:// reading, and the CLI."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import httpx
import pytest

from quarry.cli import main
from tests.fakes.documents import tiny_pdf
from worker_svc.corpus import LEGACY_ROOT, Corpus, CorpusError
from worker_svc.web.pages import PageError, PageReader


def write_folder(folder: Path) -> None:
    (folder / "notes").mkdir(parents=True)
    (folder / "eiffel.md").write_text("# The Eiffel Tower\n\nThe tower is 330 metres tall and stands in Paris.\n")
    (folder / "notes" / "louvre.html").write_text(
        "<html><head><title>The Louvre</title></head><body><article><p>The Louvre is the world's most-visited "
        "museum, in Paris. It holds the Mona Lisa and thousands of other works.</p></article></body></html>"
    )
    (folder / "bridges.txt").write_text("Paris has 37 bridges across the Seine. The tower is not a bridge.")
    (folder / "report.pdf").write_bytes(tiny_pdf(["Gustave Eiffel's company built the tower."], "Tower report"))
    (folder / "image.png").write_bytes(b"\x89PNG not indexed")


@pytest.fixture
def corpus(tmp_path: Path) -> Corpus:
    write_folder(tmp_path / "docs")
    return Corpus(tmp_path / "index" / "corpus.db")


async def test_index_search_and_read(corpus: Corpus, tmp_path: Path) -> None:
    report = corpus.index_folder(tmp_path / "docs")
    assert report.root == "docs"
    assert sorted(report.added) == ["bridges.txt", "eiffel.md", "notes/louvre.html", "report.pdf"]
    results = await corpus.search("eiffel tower height", 10)
    assert results[0].url == "corpus://docs/eiffel.md", "bm25 ranks the most relevant document first"
    assert results[0].title == "The Eiffel Tower"
    assert {r.url for r in results} >= {"corpus://docs/eiffel.md", "corpus://docs/report.pdf"}
    assert await corpus.search('mona "lisa', 5), "quotes and operators in a query are just words"
    assert await corpus.search("", 5) == []
    title, text = await corpus.read("corpus://docs/notes/louvre.html")
    assert title == "The Louvre" and "Mona Lisa" in text


async def test_a_document_with_only_the_query_s_common_words_is_no_match(corpus: Corpus, tmp_path: Path) -> None:
    corpus.index_folder(tmp_path / "docs")
    assert {r.url for r in await corpus.search("how tall is the tower", 10)} == {
        "corpus://docs/eiffel.md",
        "corpus://docs/bridges.txt",
        "corpus://docs/report.pdf",
    }, "the Louvre's page has `is` and `the`, not `tall` or `tower`"
    assert len(await corpus.search("is the", 10)) == 4, "a query of common words alone still looks for them"


async def test_indexing_is_incremental(corpus: Corpus, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    corpus.index_folder(docs)
    (docs / "bridges.txt").write_text("Paris has 37 bridges. Pont Neuf is the oldest.")
    os.utime(docs / "bridges.txt", (1, 1))  # a different mtime, whatever the clock's resolution
    (docs / "eiffel.md").unlink()
    report = corpus.index_folder(docs)
    assert (report.updated, report.removed, report.unchanged) == (["bridges.txt"], ["eiffel.md"], 2)
    assert [r.url for r in await corpus.search("Pont Neuf", 5)] == ["corpus://docs/bridges.txt"]
    assert await corpus.search("330 metres", 5) == []


async def test_page_tools_read_corpus_urls_like_web_pages(corpus: Corpus, tmp_path: Path) -> None:
    corpus.index_folder(tmp_path / "docs")
    async with httpx.AsyncClient() as client:
        reader = PageReader(client, corpus=corpus)
        page = await reader.read("corpus://docs/eiffel.md")
        assert page.contains("the tower is 330 metres tall")
        with pytest.raises(PageError, match="not in the corpus"):
            await reader.read("corpus://docs/missing.md")


def write_second_folder(folder: Path) -> None:
    (folder / "eiffel.md").parent.mkdir(parents=True)
    (folder / "eiffel.md").write_text("# Eiffel's bridges\n\nGustave Eiffel also built the Garabit viaduct.\n")
    (folder / "rome.txt").write_text("The Colosseum in Rome held fifty thousand spectators.")


async def test_two_roots_are_indexed_side_by_side_and_both_searched(corpus: Corpus, tmp_path: Path) -> None:
    corpus.index_folder(tmp_path / "docs")
    write_second_folder(tmp_path / "more")
    report = corpus.index_folder(tmp_path / "more")
    assert (report.root, report.added, report.removed) == ("more", ["eiffel.md", "rome.txt"], [])
    assert [r.url for r in await corpus.search("330 metres", 5)] == ["corpus://docs/eiffel.md"]
    assert [r.url for r in await corpus.search("Colosseum", 5)] == ["corpus://more/rome.txt"]
    # The same relative path in both folders is two documents.
    assert {r.url for r in await corpus.search("eiffel", 10)} >= {"corpus://docs/eiffel.md", "corpus://more/eiffel.md"}
    assert (await corpus.read("corpus://more/eiffel.md"))[0] == "Eiffel's bridges"
    roots = {root.name: root for root in corpus.roots()}
    assert {name: (root.folder, root.documents) for name, root in roots.items()} == {
        "docs": ((tmp_path / "docs").resolve(), 4),
        "more": ((tmp_path / "more").resolve(), 2),
    }
    assert all(root.indexed_at is not None for root in roots.values())


async def test_reindexing_a_root_removes_only_its_own_deleted_files(corpus: Corpus, tmp_path: Path) -> None:
    corpus.index_folder(tmp_path / "docs")
    write_second_folder(tmp_path / "more")
    corpus.index_folder(tmp_path / "more")
    (tmp_path / "docs" / "eiffel.md").unlink()
    report = corpus.index_folder(tmp_path / "docs")
    assert (report.added, report.updated, report.removed, report.unchanged) == ([], [], ["eiffel.md"], 3)
    assert [r.url for r in await corpus.search("eiffel", 10) if r.url.endswith("eiffel.md")] == [
        "corpus://more/eiffel.md"
    ]
    assert [r.url for r in await corpus.search("Colosseum", 5)] == ["corpus://more/rome.txt"]


async def test_removing_a_root_drops_only_its_documents(corpus: Corpus, tmp_path: Path) -> None:
    corpus.index_folder(tmp_path / "docs")
    write_second_folder(tmp_path / "more")
    corpus.index_folder(tmp_path / "more")
    removed = corpus.remove_root(str(tmp_path / "more"))
    assert (removed.name, removed.documents) == ("more", 2)
    assert await corpus.search("Colosseum", 5) == []
    with pytest.raises(PageError, match="not in the corpus"):
        await corpus.read("corpus://more/eiffel.md")
    assert [root.name for root in corpus.roots()] == ["docs"]
    assert [r.url for r in await corpus.search("330 metres", 5)] == ["corpus://docs/eiffel.md"]
    assert corpus.remove_root("docs").documents == 4, "a root is also named by its name"
    with pytest.raises(CorpusError, match="no root 'docs'"):
        corpus.remove_root("docs")


def test_folders_with_the_same_name_get_distinct_roots(corpus: Corpus, tmp_path: Path) -> None:
    corpus.index_folder(tmp_path / "docs")
    write_second_folder(tmp_path / "elsewhere" / "docs")
    assert corpus.index_folder(tmp_path / "elsewhere" / "docs").root == "docs-2"
    assert corpus.index_folder(tmp_path / "docs").root == "docs", "a root keeps its name when re-indexed"


async def test_binary_files_are_skipped_and_listed_whatever_their_extension(corpus: Corpus, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "dump.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)
    (docs / "noise.md").write_bytes(bytes(range(128, 256)) * 40)  # no NUL, and not UTF-8
    (docs / "latin1.txt").write_bytes("Le pont Neuf est le plus ancien pont de Paris, à côté.".encode("latin-1"))
    (docs / "paper.txt").write_bytes(tiny_pdf(["A PDF named as text is still read as a PDF."]))
    report = corpus.index_folder(docs)
    assert report.skipped == [("dump.txt", "binary content, not text"), ("noise.md", "binary content, not text")]
    assert "latin1.txt" in report.added and "paper.txt" in report.added
    assert report.ignored == {".png": 1}
    assert [r.url for r in await corpus.search("named as text", 5)] == ["corpus://docs/paper.txt"]
    # A document whose file turns binary leaves the index.
    (docs / "bridges.txt").write_bytes(b"\x00" * 64)
    report = corpus.index_folder(docs)
    assert ("bridges.txt", "binary content, not text") in report.skipped and report.removed == ["bridges.txt"]
    assert await corpus.search("Seine", 5) == []


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


def test_cli_indexes_lists_and_removes_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_folder(tmp_path / "docs")
    (tmp_path / "docs" / "blob.txt").write_bytes(b"\x00\x01binary")
    write_second_folder(tmp_path / "more")
    index = ["--index", str(tmp_path / "corpus.db")]
    assert main(["corpus", "index", str(tmp_path / "docs"), *index]) == 0
    summary = capsys.readouterr().out.splitlines()
    assert "as corpus://docs/" in summary[0] and "4 added" in summary[0] and "1 skipped" in summary[0]
    assert "  skipped blob.txt: binary content, not text" in summary
    assert "  not Markdown, HTML, text or PDF, so not indexed: 1 .png" in summary
    assert main(["corpus", "index", str(tmp_path / "more"), *index]) == 0
    assert "2 added" in capsys.readouterr().out
    assert main(["corpus", "list", *index]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in listed[:2]] == [["docs", "4", "documents"], ["more", "2", "documents"]]
    assert listed[1].endswith(str((tmp_path / "more").resolve()))
    assert listed[2:] == ["vectors: none (search is BM25 alone)"]
    assert main(["corpus", "remove", "more", *index]) == 0
    assert "removed more" in capsys.readouterr().out
    assert main(["corpus", "remove", "more", *index]) == 2
    assert "no root 'more'" in capsys.readouterr().err
    assert main(["corpus", "index", str(tmp_path / "missing"), *index]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_cli_writes_the_index_the_worker_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_folder(tmp_path / "docs")
    monkeypatch.setenv("QUARRY_WORKER_CORPUS_INDEX", str(tmp_path / "worker" / "corpus.db"))
    monkeypatch.setenv("QUARRY_DATA_DIR", str(tmp_path / "data"))
    assert main(["corpus", "index", str(tmp_path / "docs")]) == 0
    assert str(tmp_path / "worker" / "corpus.db") in capsys.readouterr().out
    assert [root.name for root in Corpus(tmp_path / "worker" / "corpus.db").roots()] == ["docs"]
