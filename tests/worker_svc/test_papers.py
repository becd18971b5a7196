"""The literature skills over arXiv's and Semantic Scholar's APIs (the literature fake, over loopback HTTP)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import date

import httpx
import pytest

from quarry.config import WorkerSettings
from tests.fakes.literature_server import ARXIV_LISTING, ATOM, Canned, Literature
from worker_svc.web.papers import LiteratureSkills, PaperError, describe, paper_ref, rank
from worker_svc.web.search import SearchError


@pytest.fixture
async def literature() -> AsyncIterator[Literature]:
    async with Literature() as served:
        served.arxiv = Canned(ARXIV_LISTING.encode(), ATOM)
        yield served


@pytest.fixture
async def skills(literature: Literature) -> AsyncIterator[LiteratureSkills]:
    async with httpx.AsyncClient() as client:
        yield LiteratureSkills(client, literature.base_url, literature.base_url, api_key="s2-key")


async def test_new_papers_asks_arxiv_for_the_categories_and_days_and_ranks_them_against_the_topic(
    skills: LiteratureSkills, literature: Literature
) -> None:
    papers = await skills.new_papers(["cs.LG", "cs.CL"], date(2026, 12, 1), date(2026, 12, 7), "wind load on towers")

    [asked] = literature.asked
    assert asked.path == "/api/query"
    assert asked.query["search_query"] == "(cat:cs.LG OR cat:cs.CL) AND submittedDate:[202612010000 TO 202612072359]"
    assert (asked.query["sortBy"], asked.query["sortOrder"]) == ("submittedDate", "descending")
    # The paper about the topic first (title and abstract), then one that names a word of it, then the rest.
    assert [paper.result.title for paper in papers] == [
        "Learning Wind Load on Lattice Towers",
        "Tokenizers for Engineering Reports",
        "A Survey of Bridge Painting Schedules",
    ]
    best = papers[0]
    assert (best.arxiv_id, best.doi, best.published) == ("2612.01002", "10.1000/towers.9", date(2026, 12, 5))
    assert best.categories == ("cs.LG", "physics.class-ph")
    assert best.result.authors == ("Ada Girder", "Dee Mesh") and best.relevance > papers[1].relevance > 0
    assert papers[2].relevance == 0
    assert best.full_text_urls == ("https://arxiv.org/html/2612.01002", "https://arxiv.org/pdf/2612.01002")
    shown = describe(best)
    assert "Ada Girder, Dee Mesh; 2026-12-05; cs.LG physics.class-ph" in shown
    assert "full text: https://arxiv.org/html/2612.01002" in shown

    # Without a topic: newest first, as listed.
    newest = await skills.new_papers(["cs.LG"], date(2026, 12, 1), date(2026, 12, 7), limit=2)
    assert [paper.arxiv_id for paper in newest] == ["2612.01003", "2612.01002"]


@pytest.mark.parametrize(
    ("categories", "since", "until", "message"),
    [
        ([], date(2026, 12, 1), date(2026, 12, 7), "name arXiv categories such as cs.CL"),
        (["cs.LG) OR all:(x"], date(2026, 12, 1), date(2026, 12, 7), "not cs.LG) OR all:(x"),
        (["cs.LG"], date(2026, 12, 7), date(2026, 12, 1), "ends (2026-12-01) before it starts (2026-12-07)"),
    ],
)
async def test_a_listing_that_cannot_be_asked_is_refused_before_arxiv_is(
    skills: LiteratureSkills, literature: Literature, categories: list[str], since: date, until: date, message: str
) -> None:
    with pytest.raises(PaperError, match=message.replace("(", r"\(").replace(")", r"\)")):
        await skills.new_papers(categories, since, until)
    assert literature.asked == []


async def test_snowballing_lists_references_and_citations_ranked_by_topic_then_citations(
    skills: LiteratureSkills, literature: Literature
) -> None:
    cited = await skills.snowball("https://arxiv.org/abs/2612.01002v2", "references", "wind load on towers")
    citing = await skills.snowball("10.1000/towers.9", "citations")

    assert [asked.path for asked in literature.asked] == [
        "/graph/v1/paper/arXiv:2612.01002/references",
        "/graph/v1/paper/DOI:10.1000/towers.9/citations",
    ]
    assert literature.asked[0].headers["x-api-key"] == "s2-key"
    assert "citationCount" in literature.asked[0].query["fields"]
    # The reference about the topic outranks the far more cited handbook; the one without an address is dropped.
    assert [paper.result.title for paper in cited] == ["Wind Pressure on Lattice Towers", "Wrought Iron Handbook"]
    assert cited[1].citations == 900 and cited[1].venue == "Engineering"
    # Without a topic, the most cited first.
    assert [(paper.result.title, paper.citations) for paper in citing] == [
        ("Tower Heights Revisited", 12),
        ("Learned Surrogates for Wind Load on Towers", 3),
    ]
    assert citing[0].arxiv_id == "2103.00009" and citing[1].published == date(2026, 2, 1)


async def test_a_paper_semantic_scholar_does_not_know_or_cannot_name_is_said_so(
    skills: LiteratureSkills, literature: Literature
) -> None:
    literature.references = Canned(json.dumps({"error": "Paper not found"}).encode(), status=404)
    with pytest.raises(PaperError, match="knows no such paper"):
        await skills.snowball("2612.09999", "references")
    with pytest.raises(PaperError, match="not an arXiv id, a DOI or a Semantic Scholar paper id"):
        await skills.snowball("the wind load paper", "citations")
    literature.citations = Canned(b"[1, 2]")
    with pytest.raises(SearchError, match="unexpected shape"):
        await skills.snowball("2612.01002", "citations")
    literature.citations = Canned(b"{}", status=429, headers={"retry-after": "7"})
    with pytest.raises(SearchError, match="wait 7 seconds"):
        await skills.snowball("2612.01002", "citations")


async def test_venue_search_asks_for_the_venue_and_year_and_ranks_by_topic(
    skills: LiteratureSkills, literature: Literature
) -> None:
    by_topic = await skills.venue_papers("NeurIPS", 2024, "wind load")
    most_cited = await skills.venue_papers("NeurIPS", 2024)

    first, second = literature.asked
    assert first.path == "/graph/v1/paper/search/bulk"
    assert (first.query["venue"], first.query["year"], first.query["query"]) == ("NeurIPS", "2024", "wind load")
    assert first.query["sort"] == "citationCount:desc" and "query" not in second.query
    assert [paper.result.title for paper in by_topic] == [
        "Wind Load Forecasting with Transformers",
        "Attention for Bridges",
    ]
    assert [paper.result.title for paper in most_cited] == [
        "Attention for Bridges",
        "Wind Load Forecasting with Transformers",
    ]
    with pytest.raises(PaperError, match="name a venue"):
        await skills.venue_papers("  ", 2024)


async def test_the_skills_use_only_the_catalogues_the_settings_name(literature: Literature) -> None:
    async with httpx.AsyncClient() as client:
        only_arxiv = WorkerSettings(literature_catalogues="arxiv", arxiv_url=literature.base_url)
        skills = LiteratureSkills.of(only_arxiv, client)
        assert skills is not None
        assert len(await skills.new_papers(["cs.LG"], date(2026, 12, 1), date(2026, 12, 7))) == 3
        with pytest.raises(PaperError, match="does not use Semantic Scholar"):
            await skills.venue_papers("NeurIPS", 2024)
        assert LiteratureSkills.of(WorkerSettings(literature_catalogues=""), client) is None


def test_paper_references_and_ranking_without_a_service() -> None:
    assert paper_ref("arXiv:2106.15928v3") == "arXiv:2106.15928"
    assert paper_ref("hep-th/9901001") == "arXiv:hep-th/9901001"
    assert paper_ref("https://doi.org/10.1145/3292500.3330701") == "DOI:10.1145/3292500.3330701"
    assert paper_ref("0123456789abcdef0123456789abcdef01234567") == "0123456789abcdef0123456789abcdef01234567"
    assert rank([], "anything") == []
