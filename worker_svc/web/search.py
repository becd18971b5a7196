"""Search behind one interface: SearXNG's JSON API, Tavily, Brave, arXiv, Semantic Scholar, or the local corpus.

The search endpoint is configuration the operator chose, so it is reached with
an ordinary client; only URLs the model picks go through the SSRF guard. Every
answer is read whole within a deadline and a size cap, so a slow or huge one is
an error for the model, never a stuck or swollen worker.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol
from xml.etree.ElementTree import Element

import defusedxml.ElementTree as SafeXml
import httpx
from defusedxml import DefusedXmlException

from quarry.config import WorkerSettings

# All one search may take by default (connecting, the whole answer), however the service paces it.
SEARCH_SECONDS = 30.0
# A page of results is kilobytes; anything far larger is refused rather than held in memory.
MAX_ANSWER_BYTES = 2 * 2**20
# Semantic Scholar's own ceiling per request; arXiv is asked for no more either.
MAX_LITERATURE_RESULTS = 100
# An abstract is the snippet of a paper; the longest are cut so ten results stay readable.
ABSTRACT_CHARS = 1500

ATOM = "{http://www.w3.org/2005/Atom}"
# arXiv's query operators: a query's own "AND" or "OR" is not a word to search for.
ARXIV_OPERATORS = frozenset({"AND", "OR", "ANDNOT"})
ARXIV_FIELD = re.compile(r"\b(?:ti|au|abs|co|jr|cat|rn|id|all):")
SEMANTIC_SCHOLAR_FIELDS = "title,authors,year,abstract,url,externalIds"


class SearchError(Exception):
    """The search backend failed; the message is for the model. status: the service's HTTP status, if it
    answered with one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SearchResult:
    title: str
    url: str
    snippet: str
    # Papers carry these (arXiv, Semantic Scholar); web pages and the corpus leave them empty.
    authors: tuple[str, ...] = ()
    year: int | None = None


class SearchResults(list[SearchResult]):
    """Results with a remark for the reader: the search fell short of what was configured (a fallback)."""

    def __init__(self, results: Iterable[SearchResult] = (), notice: str = "") -> None:
        super().__init__(results)
        self.notice = notice


class SearchBackend(Protocol):
    async def search(self, query: str, limit: int) -> list[SearchResult]: ...


def _rate_limited(service: str, retry_after: str | None) -> str:
    wait = f"wait {retry_after} seconds" if retry_after and retry_after.isdigit() else "wait a minute"
    return (
        f"{service} is limiting how often it is searched (HTTP 429): {wait} and search again, "
        "or go on with the results you have"
    )


async def _fetch(
    client: httpx.AsyncClient, service: str, method: str, url: str, seconds: float, **kwargs: Any
) -> bytes:
    """The body of a 200 answer, read whole within `seconds` and MAX_ANSWER_BYTES (decoded size)."""
    try:
        async with asyncio.timeout(seconds), client.stream(method, url, **kwargs) as response:
            if response.status_code == 429:
                raise SearchError(_rate_limited(service, response.headers.get("retry-after")), 429)
            if response.status_code != 200:
                raise SearchError(f"{service} answered HTTP {response.status_code}", response.status_code)
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise SearchError(f"{service} answered more than {MAX_ANSWER_BYTES} bytes; refused")
            return bytes(body)
    except TimeoutError as error:
        raise SearchError(f"{service} did not answer within {seconds:g} seconds") from error
    except httpx.HTTPError as error:
        raise SearchError(f"{service} could not be reached: {error}") from error


async def _get_json(
    client: httpx.AsyncClient, service: str, method: str, url: str, seconds: float, **kwargs: Any
) -> Any:
    body = await _fetch(client, service, method, url, seconds, **kwargs)
    try:
        return json.loads(body)
    except ValueError as error:
        raise SearchError(f"{service} answered something that is not JSON") from error


def _member(data: Any, key: str) -> Any:
    """`data[key]` when the answer is an object; None otherwise, which `_results` reports as a bad shape."""
    return data.get(key) if isinstance(data, dict) else None


def _results(items: Any, snippet_key: str, limit: int) -> list[SearchResult]:
    if not isinstance(items, list):
        raise SearchError("the search service answered in an unexpected shape")
    results = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("url"), str):
            results.append(
                SearchResult(str(item.get("title") or item["url"]), item["url"], str(item.get(snippet_key) or ""))
            )
    return results[:limit]


def _prose(text: str, chars: int | None = None) -> str:
    """Text on one line (feeds wrap titles and abstracts), cut to `chars`."""
    flat = " ".join(text.split())
    return flat if chars is None or len(flat) <= chars else flat[: chars - 1].rstrip() + "…"


class SearxngBackend:
    def __init__(self, client: httpx.AsyncClient, base_url: str, seconds: float = SEARCH_SECONDS) -> None:
        self._client = client
        self._url = base_url.rstrip("/") + "/search"
        self._seconds = seconds

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        data = await _get_json(
            self._client, "SearXNG", "GET", self._url, self._seconds, params={"q": query, "format": "json"}
        )
        return _results(_member(data, "results"), "content", limit)


class TavilyBackend:
    def __init__(
        self,
        client: httpx.AsyncClient,
        api_key: str,
        base_url: str = "https://api.tavily.com",
        seconds: float = SEARCH_SECONDS,
    ) -> None:
        self._client = client
        self._api_key = api_key
        self._url = base_url.rstrip("/") + "/search"
        self._seconds = seconds

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        data = await _get_json(
            self._client,
            "Tavily",
            "POST",
            self._url,
            self._seconds,
            json={"query": query, "max_results": limit},
            headers={"authorization": f"Bearer {self._api_key}"},
        )
        return _results(_member(data, "results"), "content", limit)


class BraveBackend:
    def __init__(
        self,
        client: httpx.AsyncClient,
        api_key: str,
        base_url: str = "https://api.search.brave.com",
        seconds: float = SEARCH_SECONDS,
    ) -> None:
        self._client = client
        self._api_key = api_key
        self._url = base_url.rstrip("/") + "/res/v1/web/search"
        self._seconds = seconds

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        data = await _get_json(
            self._client,
            "Brave",
            "GET",
            self._url,
            self._seconds,
            params={"q": query, "count": limit},
            headers={"x-subscription-token": self._api_key, "accept": "application/json"},
        )
        return _results(_member(_member(data, "web"), "results"), "description", limit)


class ArxivBackend:
    """arXiv's Atom API: every word of the query must occur in some field, best matches first."""

    def __init__(
        self, client: httpx.AsyncClient, base_url: str = "https://export.arxiv.org", seconds: float = SEARCH_SECONDS
    ) -> None:
        self._client = client
        self._url = base_url.rstrip("/") + "/api/query"
        self._seconds = seconds

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        # Quotes, brackets, operators and field prefixes are arXiv syntax: the model's words are searched as words.
        plain = ARXIV_FIELD.sub(" ", query)
        words = [word for word in re.findall(r'[^\s()":]+', plain) if word not in ARXIV_OPERATORS]
        if not words:
            return []
        body = await _fetch(
            self._client,
            "arXiv",
            "GET",
            self._url,
            self._seconds,
            params={
                "search_query": " AND ".join(f"all:{word}" for word in words),
                "start": 0,
                "max_results": min(limit, MAX_LITERATURE_RESULTS),
                "sortBy": "relevance",
            },
        )
        return _atom_entries(body)[:limit]


def atom_entries(body: bytes) -> list[Element]:
    """The entries of an arXiv Atom feed, parsed without a DTD."""
    try:
        # No DTD at all: an Atom feed needs none, and one could declare entities that expand without bound.
        feed = SafeXml.fromstring(body, forbid_dtd=True)
    except DefusedXmlException as error:
        raise SearchError("arXiv answered XML with a DTD or entity declarations; refused") from error
    except SafeXml.ParseError as error:
        raise SearchError("arXiv answered something that is not XML") from error
    if feed.tag != f"{ATOM}feed":
        raise SearchError("arXiv answered XML that is not an Atom feed")
    return feed.findall(f"{ATOM}entry")


def atom_result(entry: Element) -> SearchResult | None:
    """An arXiv feed's entry as a result; None for an entry without an address."""
    url = _abs_url(entry)
    if not url:
        return None
    published = entry.findtext(f"{ATOM}published") or ""
    return SearchResult(
        title=_prose(entry.findtext(f"{ATOM}title") or "") or url,
        url=url,
        snippet=_prose(entry.findtext(f"{ATOM}summary") or "", ABSTRACT_CHARS),
        authors=tuple(
            name for author in entry.findall(f"{ATOM}author") if (name := _prose(author.findtext(f"{ATOM}name") or ""))
        ),
        year=int(published[:4]) if published[:4].isdigit() else None,
    )


def _atom_entries(body: bytes) -> list[SearchResult]:
    return [result for entry in atom_entries(body) if (result := atom_result(entry)) is not None]


def _abs_url(entry: Element) -> str:
    """The entry's abstract page: its alternate link, else its id (which arXiv makes the same URL)."""
    for link in entry.findall(f"{ATOM}link"):
        if link.get("rel") == "alternate" and link.get("href"):
            return str(link.get("href"))
    return (entry.findtext(f"{ATOM}id") or "").strip()


class SemanticScholarBackend:
    """Semantic Scholar's Graph API paper search; an API key (x-api-key) buys a higher rate limit."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        api_key: str = "",
        base_url: str = "https://api.semanticscholar.org",
        seconds: float = SEARCH_SECONDS,
    ) -> None:
        self._client = client
        self._headers = {"x-api-key": api_key} if api_key else {}
        self._url = base_url.rstrip("/") + "/graph/v1/paper/search"
        self._seconds = seconds

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        data = await _get_json(
            self._client,
            "Semantic Scholar",
            "GET",
            self._url,
            self._seconds,
            # Its search finds nothing for hyphenated terms; their parts, spaced, match.
            params={
                "query": query.replace("-", " "),
                "limit": min(limit, MAX_LITERATURE_RESULTS),
                "fields": SEMANTIC_SCHOLAR_FIELDS,
            },
            headers=self._headers,
        )
        # "data" is left out when nothing matched.
        papers = data.get("data", []) if isinstance(data, dict) else None
        if not isinstance(papers, list):
            raise SearchError("Semantic Scholar answered in an unexpected shape")
        return [result for paper in papers if (result := s2_result(paper)) is not None][:limit]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def s2_result(paper: Any) -> SearchResult | None:
    """A Semantic Scholar paper object as a result; None for one without an address."""
    if not isinstance(paper, dict):
        return None
    ids = paper.get("externalIds")
    ids = ids if isinstance(ids, dict) else {}
    doi, arxiv_id = _text(ids.get("DOI")), _text(ids.get("ArXiv"))
    url = (
        _text(paper.get("url"))
        or (doi and f"https://doi.org/{doi}")
        or (arxiv_id and f"https://arxiv.org/abs/{arxiv_id}")
    )
    if not url:
        return None
    authors = paper.get("authors")
    authors = authors if isinstance(authors, list) else []
    year = paper.get("year")
    return SearchResult(
        title=_prose(_text(paper.get("title"))) or url,
        url=url,
        snippet=_prose(_text(paper.get("abstract")), ABSTRACT_CHARS),
        authors=tuple(
            name for author in authors if isinstance(author, dict) and (name := _prose(_text(author.get("name"))))
        ),
        year=year if isinstance(year, int) and not isinstance(year, bool) else None,
    )


def literature_catalogues(settings: WorkerSettings, client: httpx.AsyncClient) -> list[SearchBackend]:
    """The catalogues `literature_catalogues` names, in its order (the settings refuse an unknown name)."""
    seconds = settings.search_seconds
    named = [name.strip() for name in settings.literature_catalogues.split(",") if name.strip()]
    catalogues: list[SearchBackend] = []
    for name in named:
        if name == "arxiv":
            catalogues.append(ArxivBackend(client, settings.arxiv_url, seconds))
        elif name == "semantic_scholar":
            key = settings.search_api_key if settings.search_backend == "semantic_scholar" else ""
            catalogues.append(SemanticScholarBackend(client, key, settings.semantic_scholar_url, seconds))
    return catalogues


def http_backend(settings: WorkerSettings, client: httpx.AsyncClient) -> SearchBackend | None:
    """The web or literature service the settings name; None for the local corpus."""
    seconds = settings.search_seconds
    match settings.search_backend:
        case "searxng":
            return SearxngBackend(client, settings.searxng_url, seconds)
        case "tavily":
            return TavilyBackend(client, settings.search_api_key, seconds=seconds)
        case "brave":
            return BraveBackend(client, settings.search_api_key, seconds=seconds)
        case "arxiv":
            return ArxivBackend(client, settings.arxiv_url, seconds)
        case "semantic_scholar":
            return SemanticScholarBackend(client, settings.search_api_key, settings.semantic_scholar_url, seconds)
        case "corpus":
            return None
