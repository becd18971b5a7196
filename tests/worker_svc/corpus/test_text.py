"""Snippets: cut from a hit's stored text, around the query's words."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.fakes.openai_server import ScriptedModel
from tests.worker_svc.corpus.documents import embedder_for
from worker_svc.corpus import Corpus
from worker_svc.corpus.text import snippet


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
