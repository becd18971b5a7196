"""Pages as the research tools see them: extracted text, cut into fixed-size chunks.

A page is fetched once per URL and run (a bounded LRU cache), its readable text
extracted (trafilatura for HTML, pypdf for PDF, as-is for plain text and
Markdown), and served a chunk at a time ("page n of m") with in-page search.
Quotes are checked against the same text, after folding case and whitespace.
"""

from __future__ import annotations

import asyncio
import copy
import io
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from quarry.recording import current_run
from worker_svc.web.fetch import BodyError, read_body
from worker_svc.web.isolation import IsolatedPool, IsolationError, MemoryLimitExceeded, PoolClosed, TimeLimitExceeded
from worker_svc.web.titles import html_title, is_admonition, pdf_title

DEFAULT_CHUNK_CHARS = 4000
DEFAULT_MAX_BYTES = 5 * 1024 * 1024
# Everything one page fetch may take: connecting, redirects, headers and body.
DEFAULT_FETCH_SECONDS = 20.0
# Text past this many characters is not kept (about 500 pages of a book).
MAX_TEXT_CHARS = 2_000_000
# A quote shorter than this ("is 33", "t") proves nothing about a page.
MIN_QUOTE_CHARS = 12
# What one extraction may take, in its own process (a crafted PDF can loop or allocate without end).
DEFAULT_EXTRACT_SECONDS = 15.0
DEFAULT_EXTRACT_MEMORY_BYTES = 1024 * 2**20
DEFAULT_EXTRACT_WORKERS = 2
# What extraction imports (28 MiB of memory): where it runs, in the extraction processes and
# `quarry corpus index`, not in the worker, which only fetches.
EXTRACTION_LIBRARIES = ("trafilatura", "pypdf")


class PageError(Exception):
    """A page that cannot be read; the message is for the model."""


def normalize(text: str) -> str:
    """Case- and whitespace-insensitive form used to match quotes against page text."""
    return " ".join(text.split()).casefold()


def _chunk(text: str, size: int) -> list[str]:
    """Split on whitespace near `size` characters so words stay whole."""
    chunks: list[str] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut if cut > start else end
        chunks.append(text[start:end].strip())
        start = end
    return [chunk for chunk in chunks if chunk] or [""]


@dataclass(frozen=True)
class Hit:
    chunk: int  # 1-based, as shown to the model
    excerpt: str


@dataclass(frozen=True)
class Page:
    url: str
    title: str
    text: str
    chunks: tuple[str, ...]

    def view(self, number: int) -> str:
        """Chunk `number` (1-based) with its header."""
        if not 1 <= number <= len(self.chunks):
            raise PageError(f"{self.url} has pages 1 to {len(self.chunks)}; there is no page {number}")
        header = f"{self.title}\n{self.url}\npage {number} of {len(self.chunks)}"
        return f"{header}\n\n{self.chunks[number - 1]}"

    def search(self, query: str, *, context_chars: int = 160, max_hits: int = 10) -> list[Hit]:
        needle = query.casefold().strip()
        if not needle:
            raise PageError("the search text is empty")
        hits: list[Hit] = []
        for number, chunk in enumerate(self.chunks, start=1):
            folded = chunk.casefold()
            position = folded.find(needle)
            while position != -1 and len(hits) < max_hits:
                start, end = max(0, position - context_chars), position + len(needle) + context_chars
                hits.append(Hit(number, " ".join(chunk[start:end].split())))
                position = folded.find(needle, position + len(needle))
        return hits

    def contains(self, quote: str) -> bool:
        """Whether the page says `quote`: whole words, case and whitespace folded, long enough to mean something."""
        needle = normalize(quote)
        if len(needle) < MIN_QUOTE_CHARS:
            return False
        return re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", normalize(self.text)) is not None


def extract(url: str, content_type: str, body: bytes) -> tuple[str, str]:
    """(title, text) of a document; raises PageError for what cannot be read."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/pdf" or body.startswith(b"%PDF-"):
        return _extract_pdf(url, body)
    if kind in ("text/html", "application/xhtml+xml") or (not kind and body.lstrip()[:1] == b"<"):
        return _extract_html(url, body.decode("utf-8", errors="replace"))
    if kind.startswith("text/") or kind in ("application/json", "application/xml"):
        return url, body.decode("utf-8", errors="replace")
    raise PageError(f"{url} is {kind or 'of an unknown type'}, which cannot be read as text")


# Phrasing elements whose nesting the extractor can reorder: trafilatura moves the text of
# `<code>varchar(<em><code>n</code></em>)</code>` out of order ("varchar( ... n)"), so such an
# element is flattened to its text, in document order, before extraction.
_INLINE_TAGS = frozenset(
    {"a", "abbr", "acronym", "b", "bdi", "bdo", "big", "cite", "code", "data", "dfn", "em", "font", "i", "kbd"}
    | {"mark", "q", "s", "samp", "small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u", "var"}
)
# Elements that may sit inside a flattened inline element: other inline ones and line breaks.
_FLATTENABLE = _INLINE_TAGS | {"br", "wbr"}
_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
# Text of a heading's permalink anchor (`<a href="#id">#</a>`, Sphinx's pilcrow, ...).
_PERMALINK_TEXT = frozenset({"", "#", "¶", "§", "🔗", "⚓"})


def _flatten_inline(root: Any) -> None:
    """Replace the children of every nested inline element by their text, in document order.

    Linear in the size of the tree: which elements hold only inline content is worked out
    children first in one pass, and each element is flattened at most once.
    """
    elements = list(root.iter())  # keeps the proxies alive, so they can be set members
    not_inline: set[Any] = set()  # elements that hold a block, an image or the like
    for element in reversed(elements):
        if isinstance(element.tag, str) and (element.tag not in _FLATTENABLE or element in not_inline):
            parent = element.getparent()
            if parent is not None:
                not_inline.add(parent)
    gone: set[Any] = set()  # descendants of an element flattened already
    for element in elements:
        parent = element.getparent()
        if element is not root and (parent is None or parent in gone):
            gone.add(element)  # removed with a flattened ancestor (its children lose their parent)
        elif element.tag in _INLINE_TAGS and len(element) and element not in not_inline:
            _replace_by_text(element)


def _replace_by_text(element: Any) -> None:
    """Drop the children of `element`, keeping their text (line breaks as newlines) in place."""
    for line_break in element.iterdescendants("br"):
        line_break.tail = "\n" + (line_break.tail or "")
    text = "".join(element.itertext())
    for child in list(element):
        element.remove(child)  # the child's tail goes with it; it is in `text` already
    element.text = text


def _drop_permalinks(root: Any) -> None:
    """Remove the anchors that only link a heading to itself, so heading text is just the heading."""
    for anchor in list(root.xpath("//h1//a|//h2//a|//h3//a|//h4//a|//h5//a|//h6//a")):
        if (anchor.get("href") or "").startswith("#") and anchor.text_content().strip() in _PERMALINK_TEXT:
            anchor.drop_tree()  # keeps the anchor's tail


def _keep_headings(root: Any) -> None:
    """Turn headings into paragraphs of their text.

    trafilatura drops headings that are not inside a content frame it recognises (documentation
    generators nest them in `div.titlepage > div > div`), which loses a page's structure; as
    paragraphs they survive every extraction path and come out as a line of their own.
    """
    for heading in list(root.iter(*_HEADINGS)):
        if heading.getroottree().getroot() is not root:
            continue  # a heading inside a heading, flattened with it
        _replace_by_text(heading)
        heading.attrib.clear()
        heading.tag = "p"


def _extract_html(url: str, html: str) -> tuple[str, str]:
    import trafilatura

    tree = trafilatura.load_html(html)
    if tree is None:
        raise PageError(f"{url} has no readable text")
    _flatten_inline(tree)
    _drop_permalinks(tree)
    # The title is read before headings become paragraphs: <title>, else the first <h1>, else what
    # trafilatura's metadata finds, never an admonition's heading.
    title = html_title(tree)
    if not title:
        metadata = trafilatura.extract_metadata(copy.deepcopy(tree), default_url=url)
        found = metadata.title if metadata is not None and metadata.title else ""
        title = "" if is_admonition(found) else found
    title = title or url
    _keep_headings(tree)
    text = trafilatura.extract(tree, url=url, include_comments=False, favor_recall=True)
    if not text:
        raise PageError(f"{url} has no readable text")
    return title, text


def _extract_pdf(url: str, body: bytes) -> tuple[str, str]:
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(body))
        pages = [page.extract_text() or "" for page in reader.pages]
        text = _join_hyphenated("\n\n".join(pages))
        metadata_title = str(reader.metadata.title) if reader.metadata and reader.metadata.title else ""
        title = pdf_title(metadata_title, pages[0] if pages else "") or url
    except MemoryError:
        raise  # the memory limit, reported as such
    except Exception as error:
        # pypdf's own errors (PdfReadError, LimitReachedError, DependencyError, ...) and, from deep in
        # its parsers on hostile input, almost any built-in one (KeyError, TypeError, RecursionError, ...).
        raise PageError(f"{url} is a PDF that cannot be read ({error})") from error
    if not text.strip():
        raise PageError(f"{url} is a PDF without extractable text")
    return title, text


# A word split at a line's end by a hyphen, in text laid out for print: "exam-\nple" is "example". Only
# before a lowercase letter, so "self-\nContained" names and list dashes stay as they are.
_LINE_END_HYPHEN = re.compile(r"(\w)-\n[ \t]*([a-z])")


def _join_hyphenated(text: str) -> str:
    return _LINE_END_HYPHEN.sub(r"\1\2", text)


class DocumentSource(Protocol):
    """Where `corpus://` URLs are read from."""

    async def read(self, url: str) -> tuple[str, str]: ...


class PageReader:
    """Fetches, extracts and caches pages by URL; `corpus://` URLs come from the local index."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        corpus: DocumentSource | None = None,
        chunk_chars: int = DEFAULT_CHUNK_CHARS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        cache_size: int = 256,
        cache_chars: int = 64_000_000,
        extract_seconds: float = DEFAULT_EXTRACT_SECONDS,
        extract_memory_bytes: int = DEFAULT_EXTRACT_MEMORY_BYTES,
        extract_workers: int = DEFAULT_EXTRACT_WORKERS,
        fetch_seconds: float = DEFAULT_FETCH_SECONDS,
        extractor: Callable[[str, str, bytes], tuple[str, str]] = extract,
    ) -> None:
        self._client = client
        self._corpus = corpus
        self._chunk_chars = chunk_chars
        self._max_bytes = max_bytes
        # A total, not per read: a server trickling a byte a second never trips httpx's timeouts.
        self._fetch_seconds = fetch_seconds
        self._cache_size = cache_size
        # Bounded by size as well as count: one extracted PDF can hold millions of characters.
        self._cache_chars = cache_chars
        self._cached_chars = 0
        self._cache: OrderedDict[tuple[str, str], Page] = OrderedDict()
        # Extraction runs in a few child processes with a time and a memory limit: a hostile
        # document's process is killed and replaced, so it cannot starve later reads, hold a
        # delegation or keep the worker from stopping. `extractor` is `extract` but for tests
        # (a picklable module-level function). Its module and the extraction libraries are imported
        # as each child starts, so the time limit measures the extraction and not the import.
        self._extractor = extractor
        preload = tuple(dict.fromkeys((__name__, extractor.__module__, *EXTRACTION_LIBRARIES)))
        self._extractors = IsolatedPool(
            extract_workers, seconds=extract_seconds, memory_bytes=extract_memory_bytes, preload=preload
        )

    async def read(self, url: str) -> Page:
        # Cached per run: each run's recording then holds every page it read (quarry.recording), so that it
        # replays alone; a run's delegations still share what any of them fetched.
        key = (current_run(), url)
        page = self._cache.get(key)
        if page is not None:
            self._cache.move_to_end(key)
            return page
        if url.startswith("corpus://"):
            if self._corpus is None:
                raise PageError("no local corpus is configured")
            title, text = await self._corpus.read(url)
        else:
            content_type, body = await self._fetch(url)
            title, text = await self._extract(url, content_type, body)
        text = text[:MAX_TEXT_CHARS]
        page = Page(url=url, title=title, text=text, chunks=tuple(_chunk(text, self._chunk_chars)))
        if key not in self._cache:  # two concurrent reads of one URL cache it once
            self._cache[key] = page
            self._cached_chars += len(text)
        while self._cache and (len(self._cache) > self._cache_size or self._cached_chars > self._cache_chars):
            _, evicted = self._cache.popitem(last=False)
            self._cached_chars -= len(evicted.text)
        return page

    def close(self) -> None:
        """Kill the extraction processes, without waiting on what they extract."""
        self._extractors.close()

    def extraction_pids(self) -> list[int]:
        """Process ids of the live extraction processes."""
        return self._extractors.pids()

    async def _extract(self, url: str, content_type: str, body: bytes) -> tuple[str, str]:
        pool = self._extractors
        try:
            return await pool.run(self._extractor, url, content_type, body)
        except PageError:
            raise
        except TimeLimitExceeded:
            raise PageError(f"{url} took too long to extract: it could not be read within {pool.seconds:g} s") from None
        except MemoryLimitExceeded:
            raise PageError(
                f"{url} could not be read within the {pool.memory_bytes // 2**20} MiB extraction may use"
            ) from None
        except PoolClosed:
            raise PageError(f"{url} was not read: the worker is shutting down") from None
        except IsolationError as error:
            raise PageError(f"{url} could not be read: extraction failed ({error})") from None
        except Exception as error:  # whatever a parser raised on hostile input is the page's problem
            raise PageError(f"{url} could not be read ({type(error).__name__}: {error})") from None

    async def _fetch(self, url: str) -> tuple[str, bytes]:
        if not url.startswith(("http://", "https://")):
            raise PageError(f"{url} is not an http(s) URL")
        try:
            httpx.URL(url).host  # noqa: B018 - the host is decoded (IDNA) on first use
        except (httpx.InvalidURL, UnicodeError) as error:  # UnicodeError: IDNA, e.g. a bare "xn--" label
            raise PageError(f"{url} is not a valid URL ({error})") from error
        deadline = asyncio.timeout(self._fetch_seconds)
        try:
            async with deadline, self._client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise PageError(f"{url} answered HTTP {response.status_code}")
                body = await read_body(response, self._max_bytes)
                return response.headers.get("content-type", ""), body
        except TimeoutError as error:
            if not deadline.expired():
                raise PageError(f"{url} could not be fetched: {error}") from error
            raise PageError(f"{url} took longer than the {self._fetch_seconds:g} s a page may take to fetch") from None
        except BodyError as error:
            raise PageError(f"{url} {error}") from error
        except httpx.HTTPError as error:
            raise PageError(f"{url} could not be fetched: {error}") from error
        except (httpx.InvalidURL, UnicodeError) as error:  # e.g. a redirect to a URL httpx cannot parse
            raise PageError(f"{url} could not be fetched: it leads to an invalid URL ({error})") from error
