"""Extraction runs where it can be stopped (issue 12, item 8).

A hostile document once held extraction threads forever: every later page read timed out and
the worker could not stop. Extraction now runs in child processes with a time and a memory
limit. A parser that never ends is simulated with an extractor that sleeps or allocates without
end (passed to the reader the way `extract` is, so it runs the same code path).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from tests.fakes.web_server import ARTICLE, FixtureWeb
from worker_svc.web.fetch import AddressPolicy, guarded_client
from worker_svc.web.isolation import IsolatedPool, MemoryLimitExceeded, PoolClosed, TimeLimitExceeded
from worker_svc.web.pages import PageError, PageReader, extract

LIMIT_SECONDS = 1.0
MEMORY_BYTES = 384 * 2**20


def hostile_extract(url: str, content_type: str, body: bytes) -> tuple[str, str]:
    """`extract`, except that a body saying HANG never ends and one saying HOG allocates without end."""
    if b"HANG" in body:
        while True:
            time.sleep(3600)
    if b"HOG" in body:
        hoard = []
        while True:
            hoard.append(bytearray(16 * 2**20))
    return extract(url, content_type, body)


def sleep_forever() -> None:
    while True:
        time.sleep(3600)


def allocate_forever() -> None:
    hoard = []
    while True:
        hoard.append(bytearray(16 * 2**20))


def add(a: int, b: int) -> int:
    return a + b


def fail(message: str) -> None:
    raise ValueError(message)


CONTROL = "import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"


def dumpable() -> int:
    """PR_GET_DUMPABLE of the calling process: 0 when no other process of its user may read its memory or environ."""
    import ctypes

    return int(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))


def gone(pid: int) -> bool:
    """Whether no process (not even an unreaped zombie) has this id."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def minimal_pdf(objects: list[bytes]) -> bytes:
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return out


HELLO_PDF = minimal_pdf(
    [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] /Contents 4 0 R"
        b" /Resources << /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >> >>",
        b"<< /Length 44 >>\nstream\nBT /F1 12 Tf 10 100 Td (Hello, isolated world) Tj ET\nendstream",
    ]
)
# An xref section that declares far more entries than the file could hold: pypdf raises
# LimitReachedError, which is not a PdfReadError.
LIMIT_PDF = HELLO_PDF.replace(b"xref\n0 5\n", b"xref\n0 99999\n")


@pytest.fixture
async def hostile_reader(site: FixtureWeb) -> AsyncIterator[PageReader]:
    async with guarded_client(AddressPolicy(allow=(f"127.0.0.1:{site.port}",)), timeout=5) as client:
        # One extraction process: a page that never ends would starve every later read if it were not stopped.
        reader = PageReader(
            client,
            extract_seconds=LIMIT_SECONDS,
            extract_memory_bytes=MEMORY_BYTES,
            extract_workers=1,
            extractor=hostile_extract,
        )
        yield reader
        reader.close()


async def test_an_extraction_that_never_ends_is_stopped_and_later_reads_work(
    hostile_reader: PageReader, site: FixtureWeb
) -> None:
    article = site.add("/after.html", ARTICLE)
    for number in range(2):  # more hostile pages than there are extraction processes
        hang = site.add(f"/hang{number}.html", f"<html><body><p>HANG {number}</p></body></html>")
        with pytest.raises(PageError, match=rf"could not be read within {LIMIT_SECONDS:g} s"):
            await hostile_reader.read(hang)
        assert hostile_reader.extraction_pids() == [], "the process that overran was killed"
    page = await hostile_reader.read(article)
    assert "wrought-iron lattice tower" in page.text
    assert len(hostile_reader.extraction_pids()) == 1


async def test_an_extraction_that_allocates_without_end_is_stopped(
    hostile_reader: PageReader, site: FixtureWeb
) -> None:
    hog = site.add("/hog.html", "<html><body><p>HOG</p></body></html>")
    with pytest.raises(PageError, match=r"could not be read within the 384 MiB extraction may use"):
        await hostile_reader.read(hog)
    page = await hostile_reader.read(site.add("/after.html", ARTICLE))
    assert "wrought-iron lattice tower" in page.text


async def test_closing_the_reader_kills_a_busy_extraction_and_leaves_no_process(
    hostile_reader: PageReader, site: FixtureWeb
) -> None:
    article = site.add("/first.html", ARTICLE)
    await hostile_reader.read(article)
    hang = site.add("/hang.html", "<html><body><p>HANG</p></body></html>")
    reading = asyncio.create_task(hostile_reader.read(hang))
    for _ in range(200):  # until the fetch is done and the page is with the extraction process
        await asyncio.sleep(0.01)
        if "/hang.html" in site.hits:
            break
    await asyncio.sleep(0.2)
    pids = hostile_reader.extraction_pids()
    assert len(pids) == 1
    hostile_reader.close()
    assert all(gone(pid) for pid in pids), "killed and reaped, no zombie left"
    with pytest.raises(PageError, match="shutting down"):
        await reading
    with pytest.raises(PageError, match="shutting down"):
        await hostile_reader.read(site.add("/later.html", ARTICLE))


def test_a_pypdf_limit_error_is_a_page_error() -> None:
    assert "Hello, isolated world" in extract("https://x/hello.pdf", "application/pdf", HELLO_PDF)[1]
    with pytest.raises(PageError, match=r"is a PDF that cannot be read \(Declared size 99999"):
        extract("https://x/limit.pdf", "application/pdf", LIMIT_PDF)


async def test_a_pypdf_error_in_the_extraction_process_reaches_the_model(
    hostile_reader: PageReader, site: FixtureWeb
) -> None:
    url = site.add("/limit.pdf", LIMIT_PDF, content_type="application/pdf")
    with pytest.raises(PageError, match="is a PDF that cannot be read"):
        await hostile_reader.read(url)
    assert "Hello, isolated world" in (await hostile_reader.read(site.add("/hello.pdf", HELLO_PDF))).text


async def test_the_pool_runs_calls_and_raises_their_errors() -> None:
    pool = IsolatedPool(2, seconds=30)
    try:
        assert await asyncio.gather(*(pool.run(add, n, n) for n in range(4))) == [0, 2, 4, 6]
        with pytest.raises(ValueError, match="no good"):
            await pool.run(fail, "no good")
        assert len(pool.pids()) == 2, "children are reused, also after a call that raised"
    finally:
        pool.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="prctl is Linux's")
async def test_an_extraction_process_is_not_dumpable_as_it_holds_the_workers_environment() -> None:
    pool = IsolatedPool(1, seconds=30, preload=(__name__,))
    try:
        # The control: a new process is dumpable (this one may not be: a test before may have run a service here).
        control = await asyncio.create_subprocess_exec(sys.executable, "-c", CONTROL, stdout=subprocess.PIPE)
        assert (await control.communicate())[0].strip() == b"1"
        assert await pool.run(dumpable) == 0
    finally:
        pool.close()


async def test_the_pool_stops_calls_at_its_limits_and_replaces_the_process() -> None:
    # Each child imports this module as it starts (within the start timeout), not during a call timed
    # by the 1 s limit: on a loaded machine that import alone can take longer.
    pool = IsolatedPool(1, seconds=LIMIT_SECONDS, memory_bytes=MEMORY_BYTES, preload=(__name__,))
    try:
        with pytest.raises(TimeLimitExceeded):
            await pool.run(sleep_forever)
        with pytest.raises(MemoryLimitExceeded):
            await pool.run(allocate_forever)
        assert await pool.run(add, 1, 2) == 3
    finally:
        pool.close()


async def test_a_cancelled_call_kills_its_process() -> None:
    pool = IsolatedPool(1, seconds=600)
    try:
        assert await pool.run(add, 1, 1) == 2
        (pid,) = pool.pids()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await pool.run(sleep_forever)
        assert gone(pid)
        assert pool.pids() == []
    finally:
        pool.close()
    with pytest.raises(PoolClosed):
        await pool.run(add, 1, 1)
