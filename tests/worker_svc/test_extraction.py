"""HTML extraction keeps inline text in document order and keeps headings (issue 12, item 12).

The pages are shaped like a real database manual (tests/fakes/manual_pages.py), where the
extractor reordered nested inline code and dropped most section headings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.manual_pages import CHARACTER_TYPES, CREATE_SEQUENCE, MANUAL, ManualPage
from tests.fakes.web_server import FixtureWeb
from worker_svc.web.fetch import AddressPolicy, guarded_client
from worker_svc.web.pages import PageReader, extract, normalize

BY_NAME = pytest.mark.parametrize("manual", MANUAL, ids=lambda page: page.path.rsplit("/", 1)[-1])


@pytest.fixture
async def reader(site: FixtureWeb) -> AsyncIterator[PageReader]:
    async with guarded_client(AddressPolicy(allow=(f"127.0.0.1:{site.port}",)), timeout=5) as client:
        reader = PageReader(client)
        yield reader
        reader.close()


def text_of(manual: ManualPage) -> str:
    return extract(f"https://www.postgresql.org{manual.path}", "text/html", manual.html.encode())[1]


def test_nested_inline_code_keeps_its_order() -> None:
    folded = normalize(text_of(CHARACTER_TYPES))
    assert "varchar(n) than to char(n)" in folded
    assert "varchar( than to n)char(" not in folded
    assert "character varying(n) and character(n), where n is a positive integer" in folded
    # inside a table cell, a preformatted synopsis and a definition list as well
    assert "character varying(n), varchar(n)" in folded
    sequence = normalize(text_of(CREATE_SEQUENCE))
    assert "the optional clause increment by increment specifies which value" in sequence
    assert "[ as data_type ] [ increment [ by ] increment ]" in sequence


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ("<code>varchar(<em><code>n</code></em>)</code>", "varchar(n) than to"),
        ("<a href='/f'><code>f(<var>x</var>, <var>y</var>)</code></a>", "f(x, y) than to"),
        ("<strong>a<em>b<code>c<sub>d</sub></code>e</em>f</strong>", "abcdef than to"),
        ("<kbd>line<br>break</kbd>", "line break than to"),
        ("<span>a<!-- hidden -->b<tt>c</tt></span>", "abc than to"),
        ("<span>" * 200 + "deep<b>est</b>" + "</span>" * 200, "deepest than to"),
        ("<code>a<span>b <img src='x.png'> c</span>d<em><code>e</code></em>f</code>", "ab cdef than to"),
    ],
)
def test_any_nesting_of_inline_elements_reads_in_order(html: str, expected: str) -> None:
    body = "<p>Filler text for a paragraph that is long enough to be kept by the extractor.</p>" * 3
    paragraph = f"<p>Prefer {html} than to anything else.</p>"
    page = f"<html><body><article><h1>Nesting</h1>{body}{paragraph}</article></body></html>"
    assert expected in normalize(extract("https://example.org/", "text/html", page.encode())[1])


@BY_NAME
def test_every_heading_is_kept_in_order(manual: ManualPage) -> None:
    lines = [line.strip() for line in text_of(manual).splitlines()]
    positions = []
    for heading in manual.headings:
        assert heading in lines, f"heading {heading!r} is missing"
        positions.append(lines.index(heading, positions[-1] + 1 if positions else 0))
    assert positions == sorted(positions)


@BY_NAME
def test_navigation_is_still_dropped(manual: ManualPage) -> None:
    text = text_of(manual)
    for boilerplate in manual.boilerplate:
        assert boilerplate not in text
    assert "#" not in text, "permalink anchors are not part of a heading"


@BY_NAME
async def test_quotes_from_the_page_are_verified(manual: ManualPage, site: FixtureWeb, reader: PageReader) -> None:
    page = await reader.read(site.add(manual.path, manual.html))
    assert page.title == manual.title
    for quote in manual.quotes:
        assert page.contains(quote), f"the page does not say {quote!r}"
    for phrase in manual.phrases:
        assert page.search(phrase), f"search cannot find {phrase!r}"
    assert not page.contains("Prefer varchar( than to n)char( in new schemas")
