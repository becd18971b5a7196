"""Each search backend against the fixture web speaking its API's JSON."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.fakes.web_server import FixtureWeb
from worker_svc.web.search import BraveBackend, SearchBackend, SearchError, SearxngBackend, TavilyBackend


@pytest.fixture
def louvre(site: FixtureWeb) -> FixtureWeb:
    site.add("/louvre.html", "<html><body><p>The Louvre is a museum in Paris.</p></body></html>")
    return site


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5) as client:
        yield client


def backends(site: FixtureWeb, http: httpx.AsyncClient, key: str = "test-key") -> list[SearchBackend]:
    return [
        SearxngBackend(http, site.base_url),
        TavilyBackend(http, key, base_url=f"{site.base_url}/tavily"),
        BraveBackend(http, key, base_url=f"{site.base_url}/brave"),
    ]


async def test_every_backend_returns_titled_results(louvre: FixtureWeb, http: httpx.AsyncClient) -> None:
    site = louvre
    for backend in backends(site, http):
        results = await backend.search("eiffel tower", 5)
        assert [r.url for r in results] == [f"{site.base_url}/article.html"], type(backend).__name__
        assert results[0].title and "eiffel" in results[0].snippet
        both = await backend.search("paris", 1)
        assert len(both) == 1, "the limit is honoured"


async def test_backend_failures_are_search_errors(site: FixtureWeb, http: httpx.AsyncClient) -> None:
    for backend in backends(site, http, key="wrong")[1:]:
        with pytest.raises(SearchError, match="HTTP 401"):
            await backend.search("x", 5)
    with pytest.raises(SearchError, match="could not be reached"):
        await SearxngBackend(http, "http://127.0.0.1:9").search("x", 5)
