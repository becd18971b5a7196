"""A local fixture web on 127.0.0.1 for tests: pages, redirects, and a SearXNG-style search.

Hostile servers too: pages with any headers (a Content-Encoding that lies), redirects
with a Location sent byte for byte, and a body that trickles a byte at a time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from tests.fakes.loopback import Served, serve_on_loopback

ARTICLE = """<!doctype html>
<html><head><title>The Eiffel Tower</title></head>
<body>
<nav>Home | About | Contact</nav>
<article>
<h1>The Eiffel Tower</h1>
<p>The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.
It is named after the engineer Gustave Eiffel, whose company designed and built the tower
from 1887 to 1889.</p>
<p>The tower is 330 metres tall, about the same height as an 81-storey building, and the
tallest structure in Paris.</p>
</article>
<footer>Copyright fixture web</footer>
</body></html>
"""


@dataclass
class FixtureWeb(Served):
    pages: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # path -> (content type, body)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # path -> more response headers
    locations: dict[str, str] = field(default_factory=dict)  # path -> a Location header, sent as is
    # /trickle sends this many bytes, one per `trickle_seconds`, then ends.
    trickle_bytes: int = 50
    trickle_seconds: float = 0.1
    hits: list[str] = field(default_factory=list)
    base_url: str = ""
    port: int = 0
    _runner: web.AppRunner | None = None

    def add(
        self,
        path: str,
        body: str | bytes,
        content_type: str = "text/html; charset=utf-8",
        headers: dict[str, str] | None = None,
    ) -> str:
        self.pages[path] = (content_type, body.encode() if isinstance(body, str) else body)
        self.headers[path] = headers or {}
        return f"{self.base_url}{path}"

    def add_redirect(self, path: str, location: str) -> str:
        """A 302 whose Location is `location` exactly (aiohttp's own redirects would normalise it)."""
        self.locations[path] = location
        return f"{self.base_url}{path}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/redirect", self._redirect)
        app.router.add_get("/trickle", self._trickle)
        app.router.add_get("/search", self._searxng)
        app.router.add_post("/tavily/search", self._tavily)
        app.router.add_get("/brave/res/v1/web/search", self._brave)
        app.router.add_get("/{path:.*}", self._page)
        self._runner, self.port = await serve_on_loopback(app)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.add("/article.html", ARTICLE)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _matches(self, query: str) -> list[dict[str, str]]:
        """Indexed pages whose text contains every word of the query."""
        words = query.casefold().split()
        found = []
        for path, (content_type, body) in self.pages.items():
            text = body.decode("utf-8", errors="replace").casefold()
            if "html" in content_type and all(word in text for word in words):
                found.append({"title": path.strip("/"), "url": f"{self.base_url}{path}", "content": text[:120]})
        return found

    async def _searxng(self, request: web.Request) -> web.Response:
        self.hits.append("/search")
        if request.query.get("format") != "json":
            raise web.HTTPForbidden()
        return web.json_response({"query": request.query["q"], "results": self._matches(request.query["q"])})

    async def _tavily(self, request: web.Request) -> web.Response:
        body = await request.json()
        if request.headers.get("authorization") != "Bearer test-key":
            raise web.HTTPUnauthorized()
        return web.json_response({"results": self._matches(body["query"])[: body.get("max_results", 5)]})

    async def _brave(self, request: web.Request) -> web.Response:
        if request.headers.get("x-subscription-token") != "test-key":
            raise web.HTTPUnauthorized()
        results = [{**r, "description": r["content"]} for r in self._matches(request.query["q"])]
        return web.json_response({"web": {"results": results}})

    async def _redirect(self, request: web.Request) -> web.Response:
        self.hits.append(str(request.rel_url))
        raise web.HTTPFound(request.query["to"])

    async def _page(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["path"]
        self.hits.append(path)
        if path in self.locations:
            return web.Response(status=302, headers={"location": self.locations[path]})
        if path not in self.pages:
            raise web.HTTPNotFound()
        content_type, body = self.pages[path]
        return web.Response(body=body, headers={"content-type": content_type, **self.headers.get(path, {})})

    async def _trickle(self, request: web.Request) -> web.StreamResponse:
        self.hits.append("/trickle")
        response = web.StreamResponse(headers={"content-type": "text/plain"})
        await response.prepare(request)
        try:
            for _ in range(self.trickle_bytes):
                await response.write(b"x")
                await asyncio.sleep(self.trickle_seconds)
            await response.write_eof()
        except ConnectionError:
            pass  # the client gave up
        return response
