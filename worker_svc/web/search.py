"""Web search behind one interface: SearXNG's JSON API, Tavily, Brave, or the local corpus.

The search endpoint is configuration the operator chose, so it is reached with
an ordinary client; only URLs the model picks go through the SSRF guard.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx


class SearchError(Exception):
    """The search backend failed; the message is for the model."""


@dataclass(frozen=True)
class SearchResult:
    title: str
    url: str
    snippet: str


class SearchResults(list[SearchResult]):
    """Results with a remark for the reader: the search fell short of what was configured (a fallback)."""

    def __init__(self, results: Iterable[SearchResult] = (), notice: str = "") -> None:
        super().__init__(results)
        self.notice = notice


class SearchBackend(Protocol):
    async def search(self, query: str, limit: int) -> list[SearchResult]: ...


async def _get_json(client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> Any:
    try:
        response = await client.request(method, url, **kwargs)
    except httpx.HTTPError as error:
        raise SearchError(f"the search service could not be reached: {error}") from error
    if response.status_code != 200:
        raise SearchError(f"the search service answered HTTP {response.status_code}")
    try:
        return response.json()
    except ValueError as error:
        raise SearchError("the search service answered something that is not JSON") from error


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


class SearxngBackend:
    def __init__(self, client: httpx.AsyncClient, base_url: str) -> None:
        self._client = client
        self._url = base_url.rstrip("/") + "/search"

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        data = await _get_json(self._client, "GET", self._url, params={"q": query, "format": "json"})
        return _results(_member(data, "results"), "content", limit)


class TavilyBackend:
    def __init__(self, client: httpx.AsyncClient, api_key: str, base_url: str = "https://api.tavily.com") -> None:
        self._client = client
        self._api_key = api_key
        self._url = base_url.rstrip("/") + "/search"

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        data = await _get_json(
            self._client,
            "POST",
            self._url,
            json={"query": query, "max_results": limit},
            headers={"authorization": f"Bearer {self._api_key}"},
        )
        return _results(_member(data, "results"), "content", limit)


class BraveBackend:
    def __init__(self, client: httpx.AsyncClient, api_key: str, base_url: str = "https://api.search.brave.com") -> None:
        self._client = client
        self._api_key = api_key
        self._url = base_url.rstrip("/") + "/res/v1/web/search"

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        data = await _get_json(
            self._client,
            "GET",
            self._url,
            params={"q": query, "count": limit},
            headers={"x-subscription-token": self._api_key, "accept": "application/json"},
        )
        return _results(_member(_member(data, "web"), "results"), "description", limit)
