"""`quarry papers`: the literature skills from the command line, against the literature fake over HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from quarry.cli import main
from tests.fakes.literature_server import ARXIV_LISTING, ATOM, Canned, Literature


@pytest.fixture
async def literature(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Literature]:
    async with Literature() as served:
        served.arxiv = Canned(ARXIV_LISTING.encode(), ATOM)
        monkeypatch.setenv("QUARRY_WORKER_ARXIV_URL", served.base_url)
        monkeypatch.setenv("QUARRY_WORKER_SEMANTIC_SCHOLAR_URL", served.base_url)
        yield served


async def quarry(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def test_new_papers_are_listed_ranked_against_the_topic(
    literature: Literature, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        await quarry("papers", "new", "cs.LG", "--since", "2026-12-01", "--until", "2026-12-07", "--topic", "wind") == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "New on arXiv in cs.LG from 2026-12-01 to 2026-12-07, ranked against 'wind':"
    assert out[1] == "- Learning Wind Load on Lattice Towers"
    assert "  full text: https://arxiv.org/html/2612.01002 (PDF: https://arxiv.org/pdf/2612.01002)" in out
    [asked] = literature.asked
    assert asked.query["search_query"] == "(cat:cs.LG) AND submittedDate:[202612010000 TO 202612072359]"

    # Without --since: the day before --until.
    assert await quarry("papers", "new", "cs.LG", "--until", "2026-12-07", "--limit", "1", "--json") == 0
    [listing] = json.loads(capsys.readouterr().out)
    assert [paper["arxiv_id"] for paper in listing["papers"]] == ["2612.01003"]
    assert listing["papers"][0]["published"] == "2026-12-06" and listing["papers"][0]["categories"] == ["cs.CY"]
    assert "submittedDate:[202612060000 TO 202612072359]" in literature.asked[-1].query["search_query"]


async def test_snowball_and_venue_list_semantic_scholars_papers(
    literature: Literature, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await quarry("papers", "snowball", "2612.01002") == 0
    out = capsys.readouterr().out
    assert "Cited by 2612.01002, most cited first:\n- Wrought Iron Handbook" in out
    assert "\n\nCiting 2612.01002, most cited first:\n- Tower Heights Revisited" in out
    assert [asked.path.rsplit("/", 1)[-1] for asked in literature.asked] == ["references", "citations"]

    assert await quarry("papers", "venue", "NeurIPS", "2024", "--topic", "wind load", "--limit", "1") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["NeurIPS 2024, ranked against 'wind load':", "- Wind Load Forecasting with Transformers"]


async def test_failures_are_one_line_and_a_status(
    literature: Literature, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    literature.references = Canned(b'{"error": "Paper not found"}', status=404)
    assert await quarry("papers", "snowball", "2612.09999", "--direction", "references") == 1
    assert capsys.readouterr().err == "quarry papers: Semantic Scholar knows no such paper\n"
    assert await quarry("papers", "new", "not a category") == 1
    assert "name arXiv categories such as cs.CL" in capsys.readouterr().err
    monkeypatch.setenv("QUARRY_WORKER_LITERATURE_CATALOGUES", "")
    assert await quarry("papers", "venue", "ACL", "2024") == 2
    assert "set QUARRY_WORKER_LITERATURE_CATALOGUES" in capsys.readouterr().err
