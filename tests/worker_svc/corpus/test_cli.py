"""`quarry corpus`: index, list, remove and search, with and without embeddings, in the worker's index."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quarry.cli import main
from tests.fakes.openai_server import ScriptedModel
from tests.worker_svc.corpus.documents import MODEL, write_documents, write_folder, write_second_folder
from worker_svc.corpus import Corpus


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


async def test_cli_indexes_with_embeddings_and_says_which_search_it_ran(
    embeddings: ScriptedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_documents(tmp_path / "docs")
    index = ["--index", str(tmp_path / "corpus.db")]
    assert await asyncio.to_thread(main, ["corpus", "index", str(tmp_path / "docs"), *index]) == 0
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["corpus", "search", "vessel harbour", "--limit", "1", *index]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["BM25 search (no embedding model configured)", "1. Harbours"]

    monkeypatch.setenv("QUARRY_WORKER_EMBEDDING_MODEL", MODEL)
    monkeypatch.setenv("QUARRY_MODEL_BASE_URL", embeddings.base_url)
    assert await asyncio.to_thread(main, ["corpus", "index", str(tmp_path / "docs"), *index]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        f"  4 documents embedded with {MODEL}, 100% of their text, in passages of at most 256 tokens overlapping by 32"
    ]
    assert await asyncio.to_thread(main, ["corpus", "list", *index]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"vectors: {MODEL}, 64 dimensions, for 4 of 4 documents"
    assert await asyncio.to_thread(main, ["corpus", "search", "vessel crossings", "--limit", "1", *index]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [f"hybrid search: BM25 fused with {MODEL} embeddings", "1. Ships"]
    assert out[2].startswith("   corpus://docs/ships.md")

    monkeypatch.setenv("QUARRY_WORKER_EMBEDDING_BASE_URL", "http://127.0.0.1:9/v1")
    assert await asyncio.to_thread(main, ["corpus", "search", "vessel harbour", "--limit", "1", *index]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("BM25 search alone: the embeddings endpoint http://127.0.0.1:9/v1")
    assert out[1] == "1. Harbours"


def test_cli_search_shows_a_tables_rows_one_per_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "fees.md").write_text("# Harbour fees\n\n| vessel | fee |\n| --- | --- |\n| ferry | 90 |\n")
    index = ["--index", str(tmp_path / "corpus.db")]
    assert main(["corpus", "index", str(docs), *index]) == 0
    capsys.readouterr()
    assert main(["corpus", "search", "ferry", *index]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert "   | vessel | fee |" in shown and "   | ferry | 90 |" in shown, shown


def test_cli_says_what_to_do_with_an_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["corpus", "index", str(tmp_path / "empty"), "--index", str(tmp_path / "corpus.db")]) == 0
    said = capsys.readouterr().out
    assert "0 added" in said and "holds no Markdown (.md), HTML (.html), text (.txt) or PDF (.pdf) file" in said
