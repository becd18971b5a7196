"""Roots: indexed incrementally side by side, re-indexed and removed on their own, binary files skipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fakes.documents import tiny_pdf
from tests.worker_svc.corpus.documents import write_second_folder
from worker_svc.corpus import Corpus, CorpusError
from worker_svc.web.pages import PageError


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


async def test_empty_blank_huge_and_malformed_files_are_skipped_each_with_its_reason(
    corpus: Corpus, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    (docs / "empty.md").write_bytes(b"")
    (docs / "blank.txt").write_text("  \n\t\n")
    with (docs / "huge.txt").open("wb") as huge:  # 100 MB, sparse: never read
        huge.truncate(100 * 2**20)
    (docs / "broken.pdf").write_bytes(b"%PDF-1.7\n1 0 obj << /Type /Catalog >> garbage")
    (docs / "tags.html").write_text("<html><body><p>Unclosed <b>tags <table><tr><td>Riveted girders<td>1889")
    report = corpus.index_folder(docs)
    skipped = dict(report.skipped)
    assert set(skipped) == {"empty.md", "blank.txt", "huge.txt", "broken.pdf"}
    assert (skipped["empty.md"], skipped["blank.txt"]) == ("empty", "no text in it")
    assert skipped["huge.txt"] == "larger than 52428800 bytes"
    assert "PDF" in skipped["broken.pdf"]
    assert "tags.html" in report.added and len(report.added) == 5  # with the folder's four good documents
    _, text = await corpus.read("corpus://docs/tags.html")
    assert "Riveted girders" in text


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
