"""The worker's research tools and the capabilities roles subscribe to.

A role declares logical capabilities ("web_search", "scratchpad"); they are
expanded here into concrete tools at run time, so a role carries only what it
needs. Every page a tool reads is remembered for the delegation: a finding may
only cite those pages, with excerpts that occur in their text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from quarry.agent.scratchpad_tools import SCRATCHPAD_TOOLS, SourceParam
from quarry.agent.tools import Tool, ToolError, ToolRegistry
from quarry.client import ScratchpadClient
from quarry.v1 import common_pb2
from worker_svc.web.pages import Page, PageError, PageReader
from worker_svc.web.search import SearchBackend, SearchError

CAPABILITIES: dict[str, list[str]] = {
    "web_search": ["perform_web_search", "read_web_page", "search_web_page", "scroll_web_page"],
    "scratchpad": ["read_scratchpad", "append_scratchpad"],
}


@dataclass
class DelegationContext:
    """What one delegation's tools share. Lives exactly as long as the delegation."""

    scratchpad: ScratchpadClient
    scratchpad_thread_id: str
    author: common_pb2.Principal
    search: SearchBackend
    pages: PageReader
    read: dict[str, Page] = field(default_factory=dict)  # pages read in this delegation, by URL
    promoted: list[int] = field(default_factory=list)

    def verify_sources(self, kind: str, sources: Sequence[SourceParam]) -> None:
        if kind == "finding" and not sources:
            raise ToolError("a finding must cite at least one source you read, with a quoted excerpt")
        for index, source in enumerate(sources, start=1):
            page = self.read.get(source.url)
            if page is None:
                read = ", ".join(self.read) or "none yet"
                raise ToolError(
                    f"source {index} ({source.url}) was not read in this task; read it first. Pages read: {read}"
                )
            if not page.contains(source.excerpt):
                raise ToolError(
                    f"source {index}: the excerpt does not occur in {source.url}; quote the page exactly "
                    "(search_web_page helps find the passage)"
                )

    async def page(self, url: str) -> Page:
        try:
            page = await self.pages.read(url)
        except PageError as error:
            raise ToolError(str(error)) from error
        self.read[url] = page
        return page


class SearchParams(BaseModel):
    query: str = Field(min_length=1, description="what to search for")
    limit: int = Field(default=5, ge=1, le=10)


class ReadPageParams(BaseModel):
    url: str = Field(description="an http(s):// or corpus:// URL from a search result or a page")


class SearchPageParams(BaseModel):
    url: str
    query: str = Field(min_length=1, description="text to find in the page")


class ScrollParams(BaseModel):
    url: str
    page: int = Field(ge=1, description="which page of the document, 1-based")


async def perform_web_search(params: SearchParams, context: DelegationContext) -> str:
    try:
        results = await context.search.search(params.query, params.limit)
    except SearchError as error:
        raise ToolError(str(error)) from error
    if not results:
        return f"No results for {params.query!r}."
    return "\n".join(f"{n}. {r.title}\n   {r.url}\n   {r.snippet}" for n, r in enumerate(results, start=1))


async def read_web_page(params: ReadPageParams, context: DelegationContext) -> str:
    return (await context.page(params.url)).view(1)


async def search_web_page(params: SearchPageParams, context: DelegationContext) -> str:
    page = await context.page(params.url)
    hits = page.search(params.query)
    if not hits:
        return f"{params.query!r} does not occur in {params.url}."
    return "\n".join(f"page {hit.chunk} of {len(page.chunks)}: …{hit.excerpt}…" for hit in hits)


async def scroll_web_page(params: ScrollParams, context: DelegationContext) -> str:
    page = await context.page(params.url)
    try:
        return page.view(params.page)
    except PageError as error:
        raise ToolError(str(error)) from error


WEB_TOOLS: list[Tool[Any, DelegationContext]] = [
    Tool("perform_web_search", "Search the web (or the local corpus) for pages.", SearchParams, perform_web_search),
    Tool("read_web_page", "Read the first page of a document's text.", ReadPageParams, read_web_page),
    Tool("search_web_page", "Find text inside a document, with the pages it is on.", SearchPageParams, search_web_page),
    Tool("scroll_web_page", "Read another page of a document.", ScrollParams, scroll_web_page),
]


def tools_for(capabilities: Sequence[str]) -> ToolRegistry[DelegationContext]:
    return ToolRegistry.for_capabilities([*WEB_TOOLS, *SCRATCHPAD_TOOLS], CAPABILITIES, capabilities)
