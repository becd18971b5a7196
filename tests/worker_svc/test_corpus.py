"""The local corpus: incremental FTS5 indexing, bm25 search, corpus:// reading, and the CLI."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from quarry.cli import main
from tests.fakes.documents import tiny_pdf
from worker_svc.corpus import Corpus
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
    assert sorted(report.added) == ["bridges.txt", "eiffel.md", "notes/louvre.html", "report.pdf"]
    results = await corpus.search("eiffel tower height", 10)
    assert results[0].url == "corpus://eiffel.md", "bm25 ranks the most relevant document first"
    assert results[0].title == "The Eiffel Tower"
    assert {r.url for r in results} >= {"corpus://eiffel.md", "corpus://report.pdf"}
    assert await corpus.search('mona "lisa', 5), "quotes and operators in a query are just words"
    assert await corpus.search("", 5) == []
    title, text = await corpus.read("corpus://notes/louvre.html")
    assert title == "The Louvre" and "Mona Lisa" in text


async def test_indexing_is_incremental(corpus: Corpus, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    corpus.index_folder(docs)
    (docs / "bridges.txt").write_text("Paris has 37 bridges. Pont Neuf is the oldest.")
    os.utime(docs / "bridges.txt", (1, 1))  # a different mtime, whatever the clock's resolution
    (docs / "eiffel.md").unlink()
    report = corpus.index_folder(docs)
    assert (report.updated, report.removed, report.unchanged) == (["bridges.txt"], ["eiffel.md"], 2)
    assert [r.url for r in await corpus.search("Pont Neuf", 5)] == ["corpus://bridges.txt"]
    assert await corpus.search("330 metres", 5) == []


async def test_page_tools_read_corpus_urls_like_web_pages(corpus: Corpus, tmp_path: Path) -> None:
    corpus.index_folder(tmp_path / "docs")
    async with httpx.AsyncClient() as client:
        reader = PageReader(client, corpus=corpus)
        page = await reader.read("corpus://eiffel.md")
        assert page.contains("the tower is 330 metres tall")
        with pytest.raises(PageError, match="not in the corpus"):
            await reader.read("corpus://missing.md")


def test_cli_indexes_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_folder(tmp_path / "docs")
    index = tmp_path / "corpus.db"
    assert main(["corpus", "index", str(tmp_path / "docs"), "--index", str(index)]) == 0
    assert "4 added" in capsys.readouterr().out
    assert main(["corpus", "index", str(tmp_path / "missing"), "--index", str(index)]) == 2
    assert "not a folder" in capsys.readouterr().err
