"""The literature skills of a researcher, over arXiv's and Semantic Scholar's APIs.

  - new papers: what arXiv received in given categories between two dates, ranked against a topic;
  - citation snowballing: a paper's references and the papers citing it (Semantic Scholar), ranked;
  - venue search: a conference's or journal's papers of one year (Semantic Scholar), ranked;
  - full text: where a paper's text can be read (arXiv's HTML rendering, else its PDF), for an
    extractor to analyse.

Ranking against a topic counts the topic's words (common words left out, endings folded) in each
paper's title and abstract, the title's twice; ties go to the more cited, then the newer. Both services
are reached as search.py reaches them: one deadline, a size cap, their 429s said in words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import date
from typing import Any, Literal
from xml.etree.ElementTree import Element

import httpx

from quarry.config import WorkerSettings
from quarry.literature import arxiv_id
from worker_svc.corpus.text import COMMON_WORDS, stem
from worker_svc.web.search import (
    ATOM,
    MAX_LITERATURE_RESULTS,
    SEARCH_SECONDS,
    SearchError,
    SearchResult,
    _fetch,
    _get_json,
    _text,
    atom_entries,
    atom_result,
    s2_result,
)

ARXIV = "{http://arxiv.org/schemas/atom}"
# An arXiv category: an archive, and a subject class where the archive has them (cs.CL, math.AG, hep-th).
CATEGORY = re.compile(r"^[a-z][a-z-]*(\.[A-Za-z][A-Za-z-]*)?$")
S2_ID = re.compile(r"^[0-9a-f]{40}$")
# How many papers a new-papers listing reads from arXiv before ranking them: a day of cs.LG is several hundred.
MAX_LISTED = 300
PAPER_FIELDS = "title,authors,year,abstract,url,externalIds,venue,publicationDate,citationCount"


class PaperError(SearchError):
    """A literature skill's request cannot be answered as asked; the message says why, for the model."""


@dataclass(frozen=True)
class Paper:
    result: SearchResult  # title, catalogue URL, abstract, authors, year
    arxiv_id: str = ""  # without its version
    doi: str = ""
    published: date | None = None
    categories: tuple[str, ...] = ()
    venue: str = ""
    citations: int | None = None
    relevance: float = 0.0  # to the topic it was ranked against; 0 without one

    @property
    def full_text_urls(self) -> tuple[str, ...]:
        """Where the paper's text can be read, best first: arXiv's HTML, then its PDF; else the catalogue's page."""
        if self.arxiv_id:
            return (f"https://arxiv.org/html/{self.arxiv_id}", f"https://arxiv.org/pdf/{self.arxiv_id}")
        return (f"https://doi.org/{self.doi}",) if self.doi else (self.result.url,)


def _date(text: str) -> date | None:
    try:
        return date.fromisoformat(text[:10])
    except ValueError:
        return None


def atom_paper(entry: Element) -> Paper | None:
    result = atom_result(entry)
    if result is None:
        return None
    return Paper(
        result,
        arxiv_id=arxiv_id(result.url),
        doi=(entry.findtext(f"{ARXIV}doi") or "").strip(),
        published=_date(entry.findtext(f"{ATOM}published") or ""),
        categories=tuple(term for c in entry.findall(f"{ATOM}category") if (term := c.get("term") or "")),
    )


def s2_paper(data: Any) -> Paper | None:
    result = s2_result(data)
    if result is None:
        return None
    ids = data.get("externalIds")
    ids = ids if isinstance(ids, dict) else {}
    citations = data.get("citationCount")
    return Paper(
        result,
        arxiv_id=arxiv_id(_text(ids.get("ArXiv"))),
        doi=_text(ids.get("DOI")),
        published=_date(_text(data.get("publicationDate"))),
        venue=" ".join(_text(data.get("venue")).split()),
        citations=citations if isinstance(citations, int) and not isinstance(citations, bool) else None,
    )


def _terms(text: str) -> set[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {stem(word) for word in words if word not in COMMON_WORDS and len(word) > 1}


def rank(papers: list[Paper], topic: str) -> list[Paper]:
    """The papers, best for the topic first (each with its relevance); without a topic, most cited first, then
    newest, else as given."""
    wanted = _terms(topic)
    scored = []
    for paper in papers:
        if wanted:
            title, abstract = _terms(paper.result.title), _terms(paper.result.snippet)
            score = sum(2 * (term in title) + (term in abstract) for term in wanted) / (3 * len(wanted))
            paper = replace(paper, relevance=round(score, 3))
        scored.append(paper)
    return sorted(
        scored,
        key=lambda p: (-p.relevance, -(p.citations or 0), -(p.published or date.min).toordinal()),
    )


def paper_ref(text: str) -> str:
    """A paper as Semantic Scholar's API names it: arXiv:ID, DOI:..., or its own 40-hex id."""
    given = text.strip()
    if arxiv := arxiv_id(given):
        return f"arXiv:{arxiv}"
    doi = re.sub(r"^(?:https?://(?:dx\.)?doi\.org/|doi:)", "", given, flags=re.IGNORECASE)
    if doi.startswith("10.") and "/" in doi:
        return f"DOI:{doi}"
    if S2_ID.match(given):
        return given
    raise PaperError(f"{text!r} is not an arXiv id, a DOI or a Semantic Scholar paper id")


class LiteratureSkills:
    """New papers (arXiv), citation snowballing and venue search (Semantic Scholar)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        arxiv_url: str | None = "https://export.arxiv.org",
        semantic_scholar_url: str | None = "https://api.semanticscholar.org",
        api_key: str = "",
        seconds: float = SEARCH_SECONDS,
    ) -> None:
        """A service given no URL (None) is not used: the skills that need it say so."""
        self._client = client
        self._arxiv = arxiv_url.rstrip("/") + "/api/query" if arxiv_url else None
        self._s2 = semantic_scholar_url.rstrip("/") + "/graph/v1" if semantic_scholar_url else None
        self._headers = {"x-api-key": api_key} if api_key else {}
        self._seconds = seconds

    @classmethod
    def of(cls, settings: WorkerSettings, client: httpx.AsyncClient) -> LiteratureSkills | None:
        """The skills over the catalogues the settings name (`literature_catalogues`); None with neither."""
        named = {name.strip() for name in settings.literature_catalogues.split(",")}
        if not named & {"arxiv", "semantic_scholar"}:
            return None
        key = settings.search_api_key if settings.search_backend == "semantic_scholar" else ""
        return cls(
            client,
            settings.arxiv_url if "arxiv" in named else None,
            settings.semantic_scholar_url if "semantic_scholar" in named else None,
            key,
            settings.search_seconds,
        )

    def _arxiv_url(self) -> str:
        if self._arxiv is None:
            raise PaperError("this worker does not use arXiv (QUARRY_WORKER_LITERATURE_CATALOGUES)")
        return self._arxiv

    def _s2_url(self) -> str:
        if self._s2 is None:
            raise PaperError("this worker does not use Semantic Scholar (QUARRY_WORKER_LITERATURE_CATALOGUES)")
        return self._s2

    async def new_papers(
        self, categories: list[str], since: date, until: date, topic: str = "", limit: int = 10
    ) -> list[Paper]:
        """Papers submitted to arXiv in the categories from `since` to `until` (both whole days), ranked."""
        bad = [category for category in categories if not CATEGORY.match(category)]
        if not categories or bad:
            raise PaperError(f"name arXiv categories such as cs.CL or math.AG (not {', '.join(bad) or 'none'})")
        if until < since:
            raise PaperError(f"the listing ends ({until}) before it starts ({since})")
        window = f"submittedDate:[{since:%Y%m%d}0000 TO {until:%Y%m%d}2359]"
        query = f"({' OR '.join(f'cat:{category}' for category in categories)}) AND {window}"
        params = {
            "search_query": query,
            "start": 0,
            "max_results": MAX_LISTED,
            "sortBy": "submittedDate",
            "sortOrder": "descending",
        }
        body = await _fetch(self._client, "arXiv", "GET", self._arxiv_url(), self._seconds, params=params)
        papers = [paper for entry in atom_entries(body) if (paper := atom_paper(entry)) is not None]
        return rank(papers, topic)[:limit]

    async def snowball(
        self, paper: str, direction: Literal["references", "citations"], topic: str = "", limit: int = 10
    ) -> list[Paper]:
        """The paper's references, or the papers citing it, ranked."""
        ref = paper_ref(paper)
        data = await self._s2_json(
            f"{self._s2_url()}/paper/{ref}/{direction}", {"fields": PAPER_FIELDS, "limit": MAX_LITERATURE_RESULTS}
        )
        # Each item holds the other paper under citedPaper (references) or citingPaper (citations).
        key = "citedPaper" if direction == "references" else "citingPaper"
        items = data.get("data", []) if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise SearchError("Semantic Scholar answered in an unexpected shape")
        papers = [p for item in items if isinstance(item, dict) and (p := s2_paper(item.get(key))) is not None]
        return rank(papers, topic)[:limit]

    async def venue_papers(self, venue: str, year: int, topic: str = "", limit: int = 10) -> list[Paper]:
        """Papers of the venue in that year, ranked (the most cited first without a topic)."""
        if not venue.strip():
            raise PaperError("name a venue, such as NeurIPS or ACL")
        params: dict[str, Any] = {
            "venue": venue.strip(),
            "year": str(year),
            "fields": PAPER_FIELDS,
            "sort": "citationCount:desc",
        }
        if topic.strip():
            params["query"] = topic.strip()
        data = await self._s2_json(f"{self._s2_url()}/paper/search/bulk", params)
        items = data.get("data", []) if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise SearchError("Semantic Scholar answered in an unexpected shape")
        papers = [paper for item in items[:MAX_LISTED] if (paper := s2_paper(item)) is not None]
        return rank(papers, topic)[:limit]

    async def _s2_json(self, url: str, params: dict[str, Any]) -> Any:
        try:
            return await _get_json(
                self._client, "Semantic Scholar", "GET", url, self._seconds, params=params, headers=self._headers
            )
        except SearchError as error:
            if error.status == 404:
                raise PaperError("Semantic Scholar knows no such paper") from error
            raise


def describe(paper: Paper, why: str = "") -> str:
    """A paper in a few lines, for a model or a terminal."""
    result = paper.result
    authors = ", ".join(result.authors[:5]) + (" et al." if len(result.authors) > 5 else "")
    facts = [
        str(paper.published or result.year or "no date"),
        *(["in " + paper.venue] if paper.venue else []),
        *([f"{paper.citations} citations"] if paper.citations is not None else []),
        *([" ".join(paper.categories[:3])] if paper.categories else []),
        *([f"relevance {paper.relevance:.2f}"] if paper.relevance else []),
        *([why] if why else []),
    ]
    lines = [f"- {result.title}", f"  {authors or 'no authors listed'}; {'; '.join(facts)}", f"  url: {result.url}"]
    if paper.arxiv_id:
        lines.append(f"  full text: {paper.full_text_urls[0]} (PDF: {paper.full_text_urls[1]})")
    if result.snippet:
        lines.append(f"  abstract: {result.snippet[:400]}{'…' if len(result.snippet) > 400 else ''}")
    return "\n".join(lines)
