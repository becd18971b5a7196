"""Hostile web servers cost a page read bounded memory and time, and bad URLs are errors for the model.

Compression bombs are measured with tracemalloc's peak (allocation, not time): a read
that inflated the body whole would allocate the full decoded size.
"""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable

import pytest

from tests.fakes.web_server import ARTICLE, FixtureWeb
from worker_svc.web.fetch import AddressPolicy, guarded_client
from worker_svc.web.pages import PageError, PageReader

MAX_BYTES = 64 * 1024
BOMB_BYTES = 64 * 1024 * 1024  # what the bombs decode to
# Reading a bomb may hold the body so far, one step of decoding and the pieces in flight; far below BOMB_BYTES.
PEAK_BOUND = 8 * MAX_BYTES + 1024 * 1024


def _gzip_of_zeros(size: int) -> bytes:
    """gzip of `size` zero bytes, compressed a megabyte at a time (the zeros are never all in memory)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(1024 * 1024)
    parts = [compressor.compress(block) for _ in range(size // len(block))]
    return b"".join(parts) + compressor.flush()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return _gzip_of_zeros(BOMB_BYTES)


@pytest.fixture
async def reader(site: FixtureWeb) -> AsyncIterator[PageReader]:
    async with guarded_client(AddressPolicy(allow=(f"127.0.0.1:{site.port}",)), timeout=5) as client:
        reader = PageReader(client, max_bytes=MAX_BYTES, fetch_seconds=10)
        yield reader
        reader.close()


@pytest.fixture
async def loopback_reader(site: FixtureWeb) -> AsyncIterator[PageReader]:
    """A reader that may reach any port on 127.0.0.1, so a URL's shape, not the address policy, decides."""
    async with guarded_client(AddressPolicy(allow=("127.0.0.1/32",)), timeout=5) as client:
        reader = PageReader(client, max_bytes=MAX_BYTES, fetch_seconds=10)
        yield reader
        reader.close()


async def _peak_while_reading(reader: PageReader, site: FixtureWeb, url: str) -> tuple[PageError, int]:
    """The PageError reading `url` raises, and the most memory Python held above the start while it ran."""
    await reader.read(f"{site.base_url}/article.html")  # one-time costs (imports, the connection) come first
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        with pytest.raises(PageError) as caught:
            await reader.read(url)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return caught.value, peak - before


async def test_gzip_inside_gzip_is_refused_without_inflating(reader: PageReader, site: FixtureWeb, bomb: bytes) -> None:
    double = gzip.compress(bomb, 9)
    assert len(double) < 4096, "small on the wire"
    url = site.add("/bomb.html", double, headers={"content-encoding": "gzip, gzip"})
    error, peak = await _peak_while_reading(reader, site, url)
    assert peak < PEAK_BOUND, f"reading a {len(double)}-byte bomb allocated {peak} bytes"
    assert "stacked content codings (gzip, gzip)" in str(error)


async def test_one_gzip_layer_is_bounded_as_it_inflates(reader: PageReader, site: FixtureWeb, bomb: bytes) -> None:
    # Sent although the client asked for identity, as some servers do.
    url = site.add("/bomb.html", bomb, headers={"content-encoding": "gzip"})
    error, peak = await _peak_while_reading(reader, site, url)
    assert peak < PEAK_BOUND, f"reading a {len(bomb)}-byte bomb allocated {peak} bytes"
    assert f"larger than {MAX_BYTES} bytes (decoded)" in str(error)


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),  # with the zlib header, as the RFC says
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw, as some servers send it
        ("identity", lambda data: data),
    ],
)
async def test_pages_compressed_anyway_are_read(
    reader: PageReader, site: FixtureWeb, coding: str, encode: Callable[[bytes], bytes]
) -> None:
    url = site.add("/compressed.html", encode(ARTICLE.encode()), headers={"content-encoding": coding})
    page = await reader.read(url)
    assert "330 metres tall" in page.text


async def test_unknown_codings_and_broken_bodies_are_errors(reader: PageReader, site: FixtureWeb) -> None:
    url = site.add("/brotli.html", b"\x1b\x00\x00", headers={"content-encoding": "br"})
    with pytest.raises(PageError, match="content coding 'br', which is not read"):
        await reader.read(url)
    url = site.add("/broken.html", b"\x1f\x8b not gzip at all", headers={"content-encoding": "gzip"})
    with pytest.raises(PageError, match="cannot be decoded"):
        await reader.read(url)


async def test_a_trickling_server_meets_the_page_time_limit(site: FixtureWeb) -> None:
    site.trickle_bytes, site.trickle_seconds = 100, 0.1  # ten seconds in all, each byte well inside httpx's timeout
    async with guarded_client(AddressPolicy(allow=(f"127.0.0.1:{site.port}",)), timeout=5) as client:
        reader = PageReader(client, fetch_seconds=0.5)
        with pytest.raises(PageError, match=r"took longer than the 0\.5 s a page may take to fetch"):
            await reader.read(f"{site.base_url}/trickle")
        reader.close()


@pytest.mark.parametrize(
    "url",
    [
        "http://0177.0.0.1/",  # octal host
        "http://[::1/",
        "http://[1::2::3]/",
        "http://xn--/",  # IDNA: malformed A-label (a UnicodeError, not an httpx one)
        "http://xn--a.com/",
        "http://a\u200db.com/",
        "http://exa\x00mple.com/",
    ],
)
async def test_unparseable_urls_are_errors_for_the_model(reader: PageReader, url: str) -> None:
    with pytest.raises(PageError, match="is not a valid URL"):
        await reader.read(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:99999/", "port 99999 is out of range"),  # the socket layer would raise OverflowError
        ("http://" + "a" * 64 + ".com/", "not a valid host name"),  # the IDNA codec refuses labels over 63
    ],
)
async def test_unreachable_url_shapes_are_errors_for_the_model(
    loopback_reader: PageReader, url: str, message: str
) -> None:
    with pytest.raises(PageError, match=message):
        await loopback_reader.read(url)


@pytest.mark.parametrize(
    "location",
    [
        "http:\\\\evil",  # backslashes, which browsers read as slashes
        "http:\\\\evil\\path",
        "http://xn--/",
        "http://0177.0.0.1/",
        "http://127.0.0.1:99999/",
        "http://" + "a" * 64 + ".com/",
    ],
)
async def test_redirects_to_bad_urls_are_errors_for_the_model(
    loopback_reader: PageReader, site: FixtureWeb, location: str
) -> None:
    url = site.add_redirect("/moved", location)
    with pytest.raises(PageError, match="could not be fetched"):
        await loopback_reader.read(url)
    assert site.hits == ["/moved"], "nothing past the redirect was fetched"
