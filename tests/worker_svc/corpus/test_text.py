"""Snippets: cut from a hit's stored text, around the query's words."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from tests.fakes.openai_server import ScriptedModel
from tests.worker_svc.corpus.documents import embedder_for
from worker_svc.corpus import Corpus
from worker_svc.corpus.text import PassageSize, embedded_share, passages, snippet


async def test_snippets_come_from_the_hit_s_text_around_the_query_words(
    embeddings: ScriptedModel, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    filler = "Cargo is loaded and unloaded by day. " * 60
    (docs / "long.txt").write_text(filler + "The lighthouse keeper trims the lamp wick nightly. " + filler)
    corpus = Corpus(tmp_path / "corpus.db", embedder_for(embeddings))
    await asyncio.to_thread(corpus.index_folder, docs)
    [hit] = (await asyncio.to_thread(corpus.retrieve, "wicks", 1)).hits
    snippet = hit.result.snippet
    assert snippet.startswith("… ") and snippet.endswith(" …")
    assert "The lighthouse keeper trims the lamp wick nightly." in snippet
    assert len(snippet) <= 210


def test_a_tables_rows_stay_one_per_line_in_a_snippet() -> None:
    filler = "Ships come in with the tide and leave with it. " * 20
    table = "Harbour fees:\n| vessel | fee |\n| --- | --- |\n| trawler | 40 |\n| ferry | 90 |\nPaid at the quay."
    shown = snippet(filler + table + " " + filler, "ferry fee", None)
    assert (
        "Harbour fees:\n| vessel | fee |\n| --- | --- |\n| trawler | 40 |\n| ferry | 90 |\nPaid at the quay." in shown
    )
    assert snippet("plain  words\nacross   lines", "words", None) == "plain words across lines"


def test_passages_fit_the_models_window_overlap_and_hold_all_the_text() -> None:
    text = " ".join(f"word{n}" for n in range(2000))
    size = PassageSize(tokens=128, overlap_tokens=16)
    cut = passages("A title", text, size)
    assert all(len(passage) <= size.chars for _, passage in cut), "title and text within the window"
    starts = [start for start, _ in cut]
    assert starts == sorted(set(starts)) and len(cut) > 20
    for (start, passage), (following, _) in itertools.pairwise(cut):
        end = start + len(passage) - len("A title\n\n")
        assert following < end, "each passage overlaps the one before"
        assert end - following <= size.overlap_chars + 10
    assert embedded_share(text, cut, "A title", size) == 1.0
    # Whatever the title's length, the text keeps room, and a word longer than a passage is cut, not lost.
    long_title = passages("T" * 5000, "x" * 3000, size)
    assert embedded_share("x" * 3000, long_title, "T" * 5000, size) == 1.0
    # Passages that leave text out: the share counts the non-blank characters some passage holds, overlaps once.
    text = "aaaa bbbb\n\ncccc dddd"
    assert embedded_share(text, [(0, "T\n\naaaa"), (2, "T\n\naa bb")], "T", size) == 6 / 16
    assert embedded_share(text, [(0, "T\n\naaaa bbbb"), (11, "T\n\ncc dddd")], "T", size) == 14 / 16
    assert embedded_share(text, [(0, "T\n\nnot in the text")], "T", size) == 0.0
    assert embedded_share("   ", [], "T", size) == 1.0
