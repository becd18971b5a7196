"""arXiv's and Semantic Scholar's search APIs on 127.0.0.1, answering whatever a test set.

The papers are made up; the shapes are the services' (as their API documentation gives them): an Atom
feed from /api/query, and Graph API JSON from /graph/v1/paper/search, /graph/v1/paper/search/bulk and
/graph/v1/paper/{id}/references and /citations. Each request is recorded (path, query string, headers)
so a test can see what was asked.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web

from tests.fakes.loopback import Served, serve_on_loopback

ATOM = "application/atom+xml; charset=utf-8"

ARXIV_FEED = """<?xml version="1.0" encoding="UTF-8"?>
<feed xmlns="http://www.w3.org/2005/Atom" xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/"
      xmlns:arxiv="http://arxiv.org/schemas/atom">
  <id>https://arxiv.org/api/fixture</id>
  <title>arXiv Query: fixture</title>
  <updated>2024-01-01T00:00:00Z</updated>
  <opensearch:totalResults>2</opensearch:totalResults>
  <opensearch:startIndex>0</opensearch:startIndex>
  <opensearch:itemsPerPage>2</opensearch:itemsPerPage>
  <entry>
    <id>http://arxiv.org/abs/1901.00001v2</id>
    <updated>2019-03-01T10:00:00Z</updated>
    <published>2019-01-02T09:30:00Z</published>
    <title>Wind Load on Wrought-Iron
      Lattice Towers</title>
    <summary>  We measure how wind load limits the height of wrought-iron lattice towers
and find that open lattices shed most of it.
</summary>
    <author><name>Ada Girder</name></author>
    <author><name>Ben Rivet</name></author>
    <author><name>Cleo Truss</name></author>
    <author><name>Dan Strut</name></author>
    <author><name>Eve Gusset</name></author>
    <author><name>Finn Purlin</name></author>
    <author><name>Gail Spandrel</name></author>
    <link href="http://arxiv.org/abs/1901.00001v2" rel="alternate" type="text/html"/>
    <link title="pdf" href="http://arxiv.org/pdf/1901.00001v2" rel="related" type="application/pdf"/>
    <arxiv:primary_category term="physics.class-ph" scheme="http://arxiv.org/schemas/atom"/>
  </entry>
  <entry>
    <id>http://arxiv.org/abs/2103.00002v1</id>
    <published>2021-03-04T12:00:00Z</published>
    <title>Rivet Fatigue in Nineteenth-Century Ironwork</title>
    <summary>Hot-driven rivets loosen under cyclic load.</summary>
    <author><name>Hal Anvil</name></author>
  </entry>
</feed>
"""

ARXIV_EMPTY = """<?xml version="1.0" encoding="UTF-8"?>
<feed xmlns="http://www.w3.org/2005/Atom" xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/">
  <id>https://arxiv.org/api/fixture</id>
  <title>arXiv Query: nothing</title>
  <opensearch:totalResults>0</opensearch:totalResults>
</feed>
"""

# "Billion laughs": ten levels of ten references, a few bytes that would expand to gigabytes.
ENTITY_BOMB = (
    '<?xml version="1.0"?>\n<!DOCTYPE feed [\n<!ENTITY lol0 "lol">\n'
    + "".join(f'<!ENTITY lol{n} "' + f"&lol{n - 1};" * 10 + '">\n' for n in range(1, 10))
    + ']>\n<feed xmlns="http://www.w3.org/2005/Atom"><entry><title>&lol9;</title></entry></feed>'
)

SEMANTIC_SCHOLAR = {
    "total": 4,
    "offset": 0,
    "data": [
        {
            "paperId": "aaa111",
            "externalIds": {"DOI": "10.1000/towers.1", "ArXiv": "1901.00001"},
            "url": "https://www.semanticscholar.org/paper/aaa111",
            "title": "Wind Load on Wrought-Iron Lattice Towers",
            "abstract": "We measure how wind load limits the height of wrought-iron lattice towers.",
            "year": 2019,
            "authors": [{"authorId": "1", "name": "Ada Girder"}, {"authorId": "2", "name": "Ben Rivet"}],
        },
        {
            "paperId": "bbb222",
            "externalIds": {"DOI": "10.1000/rivets.2"},
            "url": None,
            "title": "Rivet Fatigue in Nineteenth-Century Ironwork",
            "abstract": None,
            "year": None,
            "authors": [],
        },
        {"paperId": "ccc333", "externalIds": {"ArXiv": "2201.00003"}, "title": "Puddled Iron", "authors": None},
        {"paperId": "ddd444", "externalIds": {}, "title": "A paper with no address"},
    ],
}


# A day's listing of new papers, as arXiv's API answers a category and submittedDate query.
ARXIV_LISTING = """<?xml version="1.0" encoding="UTF-8"?>
<feed xmlns="http://www.w3.org/2005/Atom" xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/"
      xmlns:arxiv="http://arxiv.org/schemas/atom">
  <id>https://arxiv.org/api/listing</id>
  <title>arXiv Query: listing</title>
  <updated>2026-12-07T00:00:00Z</updated>
  <opensearch:totalResults>3</opensearch:totalResults>
  <entry>
    <id>http://arxiv.org/abs/2612.01003v1</id>
    <updated>2026-12-06T18:00:00Z</updated>
    <published>2026-12-06T18:00:00Z</published>
    <title>A Survey of Bridge Painting Schedules</title>
    <summary>We survey how often iron bridges are repainted.</summary>
    <author><name>Cy Brush</name></author>
    <link href="http://arxiv.org/abs/2612.01003v1" rel="alternate" type="text/html"/>
    <arxiv:primary_category term="cs.CY" scheme="http://arxiv.org/schemas/atom"/>
    <category term="cs.CY" scheme="http://arxiv.org/schemas/atom"/>
  </entry>
  <entry>
    <id>http://arxiv.org/abs/2612.01002v2</id>
    <updated>2026-12-06T09:00:00Z</updated>
    <published>2026-12-05T09:00:00Z</published>
    <title>Learning Wind Load on Lattice Towers</title>
    <summary>A neural surrogate predicts the wind load on lattice towers within 3% of the
      finite-element solution.</summary>
    <author><name>Ada Girder</name></author>
    <author><name>Dee Mesh</name></author>
    <arxiv:doi>10.1000/towers.9</arxiv:doi>
    <link href="http://arxiv.org/abs/2612.01002v2" rel="alternate" type="text/html"/>
    <link title="pdf" href="http://arxiv.org/pdf/2612.01002v2" rel="related" type="application/pdf"/>
    <arxiv:primary_category term="cs.LG" scheme="http://arxiv.org/schemas/atom"/>
    <category term="cs.LG" scheme="http://arxiv.org/schemas/atom"/>
    <category term="physics.class-ph" scheme="http://arxiv.org/schemas/atom"/>
  </entry>
  <entry>
    <id>http://arxiv.org/abs/2612.01001v1</id>
    <updated>2026-12-04T10:00:00Z</updated>
    <published>2026-12-04T10:00:00Z</published>
    <title>Tokenizers for Engineering Reports</title>
    <summary>Wind appears once here, towers never.</summary>
    <author><name>Eve Token</name></author>
    <link href="http://arxiv.org/abs/2612.01001v1" rel="alternate" type="text/html"/>
    <category term="cs.CL" scheme="http://arxiv.org/schemas/atom"/>
  </entry>
</feed>
"""


def _s2(paper_id: str, title: str, year: int, citations: int, **more: object) -> dict[str, object]:
    return {
        "paperId": paper_id,
        "externalIds": more.pop("ids", {}),
        "url": f"https://www.semanticscholar.org/paper/{paper_id}",
        "title": title,
        "abstract": more.pop("abstract", None),
        "year": year,
        "venue": more.pop("venue", ""),
        "publicationDate": more.pop("date", None),
        "citationCount": citations,
        "authors": [{"authorId": str(n), "name": name} for n, name in enumerate(more.pop("authors", ["A. Nonymous"]))],
    }


# A paper's references (each under citedPaper) and citations (under citingPaper), as the Graph API nests them.
S2_REFERENCES = {
    "offset": 0,
    "data": [
        {"citedPaper": _s2("r1", "Wrought Iron Handbook", 1880, 900, venue="Engineering")},
        {"citedPaper": _s2("r2", "Wind Pressure on Lattice Towers", 1885, 40, abstract="Towers in gales.")},
        {"citedPaper": {"paperId": None, "title": "An unlisted memo"}},
    ],
}
S2_CITATIONS = {
    "offset": 0,
    "data": [
        {"citingPaper": _s2("c1", "Tower Heights Revisited", 2021, 12, ids={"ArXiv": "2103.00009"})},
        {"citingPaper": _s2("c2", "Learned Surrogates for Wind Load on Towers", 2026, 3, date="2026-02-01")},
    ],
}
# A venue's papers of a year, most cited first, as bulk search answers it.
S2_VENUE = {
    "total": 2,
    "token": None,
    "data": [
        _s2("v1", "Attention for Bridges", 2024, 300, venue="NeurIPS"),
        _s2("v2", "Wind Load Forecasting with Transformers", 2024, 20, venue="NeurIPS", abstract="Towers."),
    ],
}


@dataclass
class Canned:
    body: bytes
    content_type: str = "application/json"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    # Hold the answer until the server stops (a service that never answers).
    stall: bool = False


@dataclass(frozen=True)
class Asked:
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class Literature(Served):
    arxiv: Canned = field(default_factory=lambda: Canned(ARXIV_FEED.encode(), ATOM))
    semantic_scholar: Canned = field(default_factory=lambda: Canned(json.dumps(SEMANTIC_SCHOLAR).encode()))
    references: Canned = field(default_factory=lambda: Canned(json.dumps(S2_REFERENCES).encode()))
    citations: Canned = field(default_factory=lambda: Canned(json.dumps(S2_CITATIONS).encode()))
    venue: Canned = field(default_factory=lambda: Canned(json.dumps(S2_VENUE).encode()))
    asked: list[Asked] = field(default_factory=list)
    base_url: str = ""
    _released: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/query", self._arxiv)
        app.router.add_get("/graph/v1/paper/search", self._semantic_scholar)
        # Before the paper routes, which would take "search" for a paper id (a DOI id holds slashes).
        app.router.add_get("/graph/v1/paper/search/bulk", self._venue)
        app.router.add_get("/graph/v1/paper/{paper:.+}/references", self._references)
        app.router.add_get("/graph/v1/paper/{paper:.+}/citations", self._citations)
        self._runner, port = await serve_on_loopback(app)
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self._released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _arxiv(self, request: web.Request) -> web.Response:
        return await self._answer(request, self.arxiv)

    async def _semantic_scholar(self, request: web.Request) -> web.Response:
        return await self._answer(request, self.semantic_scholar)

    async def _references(self, request: web.Request) -> web.Response:
        return await self._answer(request, self.references)

    async def _citations(self, request: web.Request) -> web.Response:
        return await self._answer(request, self.citations)

    async def _venue(self, request: web.Request) -> web.Response:
        return await self._answer(request, self.venue)

    async def _answer(self, request: web.Request, canned: Canned) -> web.Response:
        self.asked.append(Asked(request.path, dict(request.query), {k.lower(): v for k, v in request.headers.items()}))
        if canned.stall:
            await self._released.wait()
        return web.Response(
            status=canned.status,
            body=canned.body,
            headers={"content-type": canned.content_type, **canned.headers},
        )
