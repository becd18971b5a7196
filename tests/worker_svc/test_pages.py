"""Pages are fetched once, extracted to text, served in chunks, searched, and quotes checked."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.documents import tiny_pdf
from tests.fakes.web_server import FixtureWeb
from worker_svc.web.fetch import AddressPolicy, guarded_client
from worker_svc.web.pages import PageError, PageReader, extract


@pytest.fixture
async def reader(site: FixtureWeb) -> AsyncIterator[PageReader]:
    async with guarded_client(AddressPolicy(allow=(f"127.0.0.1:{site.port}",)), timeout=5) as client:
        yield PageReader(client, chunk_chars=120, max_bytes=64 * 1024)


async def test_html_is_extracted_without_navigation_and_cached(reader: PageReader, site: FixtureWeb) -> None:
    url = f"{site.base_url}/article.html"
    page = await reader.read(url)
    assert page.title == "The Eiffel Tower"
    assert "330 metres tall" in page.text
    assert "Home | About" not in page.text
    assert await reader.read(url) is page
    assert site.hits.count("/article.html") == 1, "fetched once, then served from the cache"


async def test_chunks_are_numbered_and_bounded(reader: PageReader, site: FixtureWeb) -> None:
    page = await reader.read(f"{site.base_url}/article.html")
    assert len(page.chunks) > 1
    assert all(len(chunk) <= 120 for chunk in page.chunks)
    assert " ".join(page.chunks).split() == page.text.split(), "no word lost or cut"
    view = page.view(2)
    assert view.startswith(f"The Eiffel Tower\n{page.url}\npage 2 of {len(page.chunks)}\n\n")
    with pytest.raises(PageError, match="no page 99"):
        page.view(99)


async def test_in_page_search_finds_text_across_chunks(reader: PageReader, site: FixtureWeb) -> None:
    page = await reader.read(f"{site.base_url}/article.html")
    hits = page.search("TOWER")
    assert len({hit.chunk for hit in hits}) > 1
    assert all("tower" in hit.excerpt.casefold() for hit in hits)
    assert page.search("not on this page") == []


async def test_quotes_match_after_folding_case_and_whitespace(reader: PageReader, site: FixtureWeb) -> None:
    page = await reader.read(f"{site.base_url}/article.html")
    assert page.contains("the tower is 330 METRES\n   tall")
    assert not page.contains("The tower is 300 metres tall")
    assert not page.contains("   ")
    assert not page.contains("is 33"), "too short to prove anything"
    assert not page.contains("tower is 330 metre"), "whole words only"


async def test_pdf_text_is_read(reader: PageReader, site: FixtureWeb) -> None:
    url = site.add(
        "/report.pdf", tiny_pdf(["Height: 330 metres.", "Built 1887-1889."], "Tower report"), "application/pdf"
    )
    page = await reader.read(url)
    assert page.title == "Tower report"
    assert page.contains("Height: 330 metres.")


async def test_unreadable_pages_are_errors_for_the_model(reader: PageReader, site: FixtureWeb) -> None:
    with pytest.raises(PageError, match="HTTP 404"):
        await reader.read(f"{site.base_url}/missing.html")
    big = site.add("/big.txt", "x" * (65 * 1024), "text/plain")
    with pytest.raises(PageError, match="larger than"):
        await reader.read(big)
    binary = site.add("/image.png", b"\x89PNG....", "image/png")
    with pytest.raises(PageError, match="cannot be read as text"):
        await reader.read(binary)
    with pytest.raises(PageError, match="not a public address"):
        await reader.read("http://10.0.0.1/")
    with pytest.raises(PageError, match="not an http"):
        await reader.read("file:///etc/passwd")


def test_broken_pdf_is_an_error() -> None:
    with pytest.raises(PageError):
        extract("http://x/broken.pdf", "application/pdf", b"%PDF-1.4 garbage")


async def test_the_cache_is_bounded_by_size(site: FixtureWeb) -> None:
    urls = [site.add(f"/doc{i}.txt", f"document {i} " + "word " * 2000, "text/plain") for i in range(5)]
    async with guarded_client(AddressPolicy(allow=(f"127.0.0.1:{site.port}",)), timeout=5) as client:
        reader = PageReader(client, cache_chars=25_000)
        for url in urls:
            await reader.read(url)
        await reader.read(urls[-1])
        assert site.hits.count("/doc4.txt") == 1, "the newest page is still cached"
        await reader.read(urls[0])
        assert site.hits.count("/doc0.txt") == 2, "the oldest was evicted to stay within the size bound"


async def test_extraction_has_a_time_limit(site: FixtureWeb) -> None:
    async with guarded_client(AddressPolicy(allow=(f"127.0.0.1:{site.port}",)), timeout=5) as client:
        # A zero limit cannot be met: extraction always happens on another thread.
        reader = PageReader(client, extract_seconds=0)
        with pytest.raises(PageError, match="too long to extract"):
            await reader.read(f"{site.base_url}/article.html")
        reader.close()


async def test_pages_are_fetched_uncompressed(site: FixtureWeb) -> None:
    async with guarded_client(AddressPolicy(allow=(f"127.0.0.1:{site.port}",)), timeout=5) as client:
        response = await client.get(f"{site.base_url}/article.html")
        assert response.request.headers["accept-encoding"] == "identity"
