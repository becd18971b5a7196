"""The worker's research tools and the capabilities roles subscribe to.

A role declares logical capabilities (a Capability: web search, the scratchpad);
they are expanded here into concrete tools at run time, so a role carries only what it
needs. Every page a tool reads is remembered for the delegation: a finding may
only cite those pages, with excerpts that occur in their text.

A blind role (one that judges others' work) gets its input refs as its whole
view: read_scratchpad shows only the entries they name, and the page tools
read only the URLs they name. It ends with its submit tool (worker_svc.outputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from quarry.agent import scratchpad_tools
from quarry.agent.scratchpad_tools import SCRATCHPAD_TOOLS, ReadParams, SourceParam, render_entries
from quarry.agent.tools import Tool, ToolError, ToolRegistry, current_call
from quarry.compute import ComputeView, MonitorError
from quarry.identity import Principal
from quarry.records.research import RECORD_TYPES, InputRefs, ResearchRecord
from quarry.research_plane import ResearchPlane
from quarry.vocabulary import JobRef
from worker_svc.capabilities import Capability
from worker_svc.outputs import OUTPUT_KINDS, OutputGate, offered_schema, submit_tool_name
from worker_svc.web.pages import Page, PageError, PageReader
from worker_svc.web.papers import LiteratureSkills, Paper, describe
from worker_svc.web.search import SearchBackend, SearchError, SearchResult, SearchResults
from worker_svc.workspace_tools import WORKSPACE_TOOLS, WorkspaceSession, describe_look

# A paper's byline names this many authors, then "et al." (some papers have thousands).
BYLINE_AUTHORS = 5
MAX_WAIT_SECONDS = 600.0  # job_status waits at most this long for a job to end

CAPABILITIES: dict[Capability, list[str]] = {
    Capability.WEB_SEARCH: ["perform_web_search", "read_web_page", "search_web_page", "scroll_web_page"],
    Capability.READ_PAGES: ["read_web_page", "search_web_page", "scroll_web_page"],
    Capability.SCRATCHPAD: ["read_scratchpad", "append_scratchpad"],
    Capability.READ_SCRATCHPAD: ["read_scratchpad"],
    Capability.LITERATURE: ["look_up_paper"],
    Capability.PAPERS: ["new_papers", "citation_snowball", "venue_papers"],
    Capability.SEARCH: ["perform_web_search"],
    Capability.COMPUTE: ["gpu_status", "job_status"],
    Capability.WORKSPACE: [
        "list_tree",
        "read_file",
        "search_code",
        "write_file",
        "apply_patch",
        "run_command",
        "launch_experiment",
        "job_status",
    ],
}


@dataclass
class DelegationContext:
    """What one delegation's tools share. Lives exactly as long as the delegation."""

    scratchpad: ResearchPlane
    scratchpad_thread_id: str
    author: Principal
    search: SearchBackend
    pages: PageReader
    # The monitor, when this worker has one (the `compute` and `workspace` capabilities need it).
    monitor: ComputeView | None = None
    # An engineer's workspace; None for every other role.
    workspace: WorkspaceSession | None = None
    read: dict[str, Page] = field(default_factory=dict)  # pages read in this delegation, by URL
    # The literature catalogues look_up_paper asks; what it and perform_web_search listed here, by URL.
    literature: Sequence[SearchBackend] = ()
    listed: dict[str, SearchResult] = field(default_factory=dict)
    # The literature skills (the `papers` capability), when this worker reaches arXiv or Semantic Scholar.
    papers: LiteratureSkills | None = None
    promoted: list[int] = field(default_factory=list)
    # A blind role's whole view: the entries and pages its contract names (None: the whole thread and web).
    inputs: InputRefs | None = None
    # Takes a structured role's output (None for a researcher).
    gate: OutputGate | None = None

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
        if self.inputs is not None and url not in self.inputs.urls:
            named = ", ".join(sorted(self.inputs.urls)) or "none"
            raise ToolError(f"this task reads only the pages its inputs name ({named}), not {url}")
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
    # Said to the model when the search fell back from what is configured (e.g. keywords without embeddings).
    notice = f"{results.notice}\n" if isinstance(results, SearchResults) and results.notice else ""
    if not results:
        return f"{notice}No results for {params.query!r}."
    context.listed.update((result.url, result) for result in results)
    return notice + "\n".join(
        f"{n}. {r.title}\n" + (f"   {byline}\n" if (byline := _byline(r)) else "") + f"   {r.url}\n   {r.snippet}"
        for n, r in enumerate(results, start=1)
    )


def _byline(result: SearchResult) -> str:
    """A paper's authors and year ("A, B, C et al. (2017)"); empty for a web page."""
    authors = ", ".join(result.authors[:BYLINE_AUTHORS])
    if len(result.authors) > BYLINE_AUTHORS:
        authors += " et al."
    year = f"({result.year})" if result.year is not None else ""
    return " ".join(part for part in (authors, year) if part)


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


class LookUpParams(BaseModel):
    query: str = Field(min_length=1, description="the paper's title, or its arXiv id or DOI, with an author's name")
    limit: int = Field(default=5, ge=1, le=10)


async def look_up_paper(params: LookUpParams, context: DelegationContext) -> str:
    """Every catalogue the worker has, asked in turn; what each lists is kept for the output gate to check."""
    if not context.literature:
        raise ToolError("this worker has no literature catalogue to look papers up in")
    lines, failures = [], []
    for catalogue in context.literature:
        try:
            results = await catalogue.search(params.query, params.limit)
        except SearchError as error:
            failures.append(str(error))
            continue
        for result in results:
            context.listed[result.url] = result
            authors = "; ".join(result.authors) or "no authors listed"
            year = result.year if result.year is not None else "no year listed"
            lines.append(f"- {result.title}\n  authors: {authors}\n  year: {year}\n  url: {result.url}")
    if not lines and failures:
        raise ToolError("; ".join(failures))
    found = "\n".join(lines) if lines else f"No catalogue lists a paper for {params.query!r}."
    return found + "".join(f"\n(one catalogue failed: {failure})" for failure in failures)


LITERATURE_TOOLS: list[Tool[Any, DelegationContext]] = [
    Tool(
        "look_up_paper",
        "Look a paper up in the literature catalogues (arXiv, Semantic Scholar): each match's title, authors, "
        "year and catalogue URL, exactly as listed.",
        LookUpParams,
        look_up_paper,
    )
]


class NewPapersParams(BaseModel):
    categories: list[str] = Field(min_length=1, max_length=10, description="arXiv categories, such as cs.CL, cs.LG")
    since: date = Field(description="the first day of the listing, YYYY-MM-DD")
    until: date | None = Field(default=None, description="its last day, YYYY-MM-DD (default: today)")
    topic: str = Field(default="", max_length=300, description="what the papers should be about: ranks them")
    limit: int = Field(default=10, ge=1, le=30)


class SnowballParams(BaseModel):
    paper: str = Field(min_length=1, max_length=300, description="an arXiv id or URL, a DOI, or a Semantic Scholar id")
    direction: Literal["references", "citations", "both"] = Field(
        default="both", description="the papers it cites, the papers citing it, or both"
    )
    topic: str = Field(default="", max_length=300, description="what the papers should be about: ranks them")
    limit: int = Field(default=10, ge=1, le=30, description="papers listed in each direction")


class VenueParams(BaseModel):
    venue: str = Field(min_length=1, max_length=200, description="a conference or journal, such as NeurIPS or ACL")
    year: int = Field(ge=1900, le=2100)
    topic: str = Field(default="", max_length=300, description="what the papers should be about: ranks them")
    limit: int = Field(default=10, ge=1, le=30)


def _skills(context: DelegationContext) -> LiteratureSkills:
    if context.papers is None:
        raise ToolError("this worker reaches neither arXiv nor Semantic Scholar")
    return context.papers


def _listing(context: DelegationContext, papers: list[Paper], heading: str, why: str = "") -> str:
    """The papers for the model; each is remembered as listed, for the output gate."""
    for paper in papers:
        context.listed[paper.result.url] = paper.result
    return "\n".join([heading, *(describe(paper, why) for paper in papers)])


async def new_papers(params: NewPapersParams, context: DelegationContext) -> str:
    until = params.until or datetime.now(UTC).date()
    try:
        papers = await _skills(context).new_papers(params.categories, params.since, until, params.topic, params.limit)
    except SearchError as error:
        raise ToolError(str(error)) from error
    where = ", ".join(params.categories)
    if not papers:
        return f"arXiv lists no paper in {where} from {params.since} to {until}."
    ranked = f", ranked against {params.topic!r}" if params.topic else ", newest first"
    return _listing(context, papers, f"New on arXiv in {where} from {params.since} to {until}{ranked}:")


async def citation_snowball(params: SnowballParams, context: DelegationContext) -> str:
    skills = _skills(context)
    directions: tuple[Literal["references", "citations"], ...] = (
        ("references", "citations") if params.direction == "both" else (params.direction,)
    )
    parts = []
    for direction in directions:
        try:
            papers = await skills.snowball(params.paper, direction, params.topic, params.limit)
        except SearchError as error:
            raise ToolError(str(error)) from error
        heading = f"{'Cited by' if direction == 'references' else 'Citing'} {params.paper} ({len(papers)} shown):"
        why = "cited by it" if direction == "references" else "cites it"
        parts.append(_listing(context, papers, heading, why) if papers else f"{heading} none listed.")
    return "\n\n".join(parts)


async def venue_papers(params: VenueParams, context: DelegationContext) -> str:
    try:
        papers = await _skills(context).venue_papers(params.venue, params.year, params.topic, params.limit)
    except SearchError as error:
        raise ToolError(str(error)) from error
    if not papers:
        return f"Semantic Scholar lists no paper of {params.venue} {params.year}" + (
            f" about {params.topic!r}." if params.topic else "."
        )
    order = f"ranked against {params.topic!r}" if params.topic else "most cited first"
    return _listing(context, papers, f"{params.venue} {params.year}, {order}:")


PAPER_TOOLS: list[Tool[Any, DelegationContext]] = [
    Tool(
        "new_papers",
        "List the papers arXiv received in some categories between two days, ranked against a topic: each with "
        "its authors, date, categories, catalogue URL, full-text URLs and abstract.",
        NewPapersParams,
        new_papers,
    ),
    Tool(
        "citation_snowball",
        "Follow a paper's citations (Semantic Scholar): the papers it cites and the papers citing it, ranked "
        "against a topic or by citations.",
        SnowballParams,
        citation_snowball,
    ),
    Tool(
        "venue_papers",
        "List a conference's or journal's papers of one year (Semantic Scholar), ranked against a topic or by "
        "citations.",
        VenueParams,
        venue_papers,
    ),
]


WEB_TOOLS: list[Tool[Any, DelegationContext]] = [
    Tool(
        "perform_web_search",
        "Search the web (or the local corpus, or the literature) for pages.",
        SearchParams,
        perform_web_search,
    ),
    Tool("read_web_page", "Read the first page of a document's text.", ReadPageParams, read_web_page),
    Tool("search_web_page", "Find text inside a document, with the pages it is on.", SearchPageParams, search_web_page),
    Tool("scroll_web_page", "Read another page of a document.", ScrollParams, scroll_web_page),
]


class GpuStatusParams(BaseModel):
    host: str = Field(default="", description="a configured host name; empty for the monitor's own machine")


class JobStatusParams(BaseModel):
    monitor_job_id: str = Field(default="", description="a job the monitor started (launch_experiment's id)")
    wait_seconds: float = Field(
        default=0.0, ge=0, le=MAX_WAIT_SECONDS, description="wait up to this long for such a job to end"
    )
    kind: Literal["local", "remote", "slurm"] | None = Field(
        default=None, description="or any job: a local pid, a pid on a host, or a Slurm job"
    )
    pid: int = Field(default=0, ge=0, description="for local and remote")
    host: str = Field(default="", description="for remote and slurm: a configured host name")
    job_id: str = Field(default="", description="for slurm")
    log_path: str = Field(default="", description="a log file whose last lines to include")


def _monitor(context: DelegationContext) -> ComputeView:
    if context.monitor is None:
        raise ToolError("this worker has no monitor configured")
    return context.monitor


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


async def gpu_status(params: GpuStatusParams, context: DelegationContext) -> str:
    try:
        gpus, unavailable_reason = await _monitor(context).gpus(params.host)
    except MonitorError as error:
        raise ToolError(f"the monitor could not answer: {error}") from error
    if not gpus:
        return f"No GPUs on {params.host or 'the monitor host'}: {unavailable_reason or 'none found'}."
    lines = []
    for gpu in gpus:
        processes = ", ".join(f"{p.pid} {p.name} ({_gib(p.used_memory_bytes)})" for p in gpu.processes) or "none"
        lines.append(
            f"{gpu.host} #{gpu.index} {gpu.name}: {gpu.utilization_percent}% busy, "
            f"{_gib(gpu.memory_used_bytes)} of {_gib(gpu.memory_total_bytes)}, {gpu.temperature_celsius} C, "
            f"{gpu.power_watts:.0f} W; processes: {processes}"
        )
    return "\n".join(lines)


async def job_status(params: JobStatusParams, context: DelegationContext) -> str:
    if params.monitor_job_id:
        job = JobRef("", log_path=params.log_path, monitor_job_id=params.monitor_job_id)
    elif params.kind is not None:
        job = JobRef(params.kind, pid=params.pid, host=params.host, job_id=params.job_id, log_path=params.log_path)
    else:
        raise ToolError("name the job: its monitor_job_id, or its kind with a pid or Slurm job_id")
    if params.wait_seconds and not params.monitor_job_id:
        raise ToolError("wait_seconds is for a job the monitor started (monitor_job_id)")
    monitor = _monitor(context)
    try:
        look = await (monitor.wait(job, seconds=params.wait_seconds) if params.wait_seconds else monitor.job(job))
    except MonitorError as error:
        raise ToolError(f"the monitor could not answer: {error}") from error
    return describe_look(look)


COMPUTE_TOOLS: list[Tool[Any, DelegationContext]] = [
    Tool(
        "gpu_status", "GPUs of a host: model, load, memory, temperature, power, processes.", GpuStatusParams, gpu_status
    ),
    Tool(
        "job_status",
        "State, exit code, metrics and last log lines of a job the monitor started, a process or a Slurm job.",
        JobStatusParams,
        job_status,
    ),
]


async def read_scratchpad(params: ReadParams, context: DelegationContext) -> str:
    if context.inputs is None:
        return await scratchpad_tools.read_scratchpad(params, context)
    if not context.inputs.entries:
        return "Your task names no scratchpad entries."
    # Read from the first input on; only the inputs are shown, the rest never reaches the model.
    after = max(params.after_sequence_no, min(context.inputs.entries) - 1)
    entries = await context.scratchpad.read_all(context.scratchpad_thread_id, after_sequence_no=after)
    return render_entries([entry for entry in entries if entry.sequence_no in context.inputs.entries])


READ_SCRATCHPAD: Tool[ReadParams, DelegationContext] = Tool(
    "read_scratchpad",
    "Read the shared research scratchpad: the seed, findings and markers other participants promoted. "
    "A task bound to its inputs sees only the entries they name.",
    ReadParams,
    read_scratchpad,
)
_CATALOG: list[Tool[Any, DelegationContext]] = [
    *WEB_TOOLS,
    *LITERATURE_TOOLS,
    *PAPER_TOOLS,
    READ_SCRATCHPAD,
    *(tool for tool in SCRATCHPAD_TOOLS if tool.name != READ_SCRATCHPAD.name),
    *COMPUTE_TOOLS,
    *WORKSPACE_TOOLS,
]


def _submit_tool(kind: str, record: type[ResearchRecord] | None) -> Tool[BaseModel, DelegationContext]:
    """`submit_<kind>`. Its arguments reach the gate unparsed, so a malformed output counts as an attempt;
    the model is shown the record's schema (for the role's own kind; other kinds are not offered)."""
    config = ConfigDict(extra="allow")
    if record is not None:
        schema = offered_schema(record)

        def show(target: dict[str, Any]) -> None:
            target.clear()
            target.update(schema)

        config = ConfigDict(extra="allow", json_schema_extra=show)
    parameters = create_model(f"Submit_{kind}", __config__=config)

    async def submit(params: BaseModel, context: DelegationContext) -> str:
        if context.gate is None:
            raise ToolError("this task ends with a summary, not a submitted record")
        call = current_call()
        return context.gate.submit(call.id, kind, call.arguments)

    return Tool(
        submit_tool_name(kind),
        f"Submit your {kind} and end the task. Its fields are checked before anything is recorded.",
        parameters,
        submit,
    )


_RECORDS_BY_KIND = {record.record_kind(): record for record in RECORD_TYPES.values()}
# Built once: a tool's declaration is cached by its parameters' class.
SUBMIT_TOOLS: dict[str, Tool[BaseModel, DelegationContext]] = {
    kind: _submit_tool(kind, _RECORDS_BY_KIND.get(kind)) for kind in OUTPUT_KINDS
}


def tools_for(
    capabilities: Sequence[Capability], output: type[ResearchRecord] | None = None
) -> ToolRegistry[DelegationContext]:
    """The role's tools; a role with an output also gets its submit tool, and answers (unoffered) the others."""
    listed = ToolRegistry.for_capabilities(_CATALOG, CAPABILITIES, capabilities)
    if output is None:
        return listed
    by_name = {tool.name: tool for tool in _CATALOG}
    own = output.record_kind()
    return ToolRegistry(
        [*(by_name[name] for name in listed.names), SUBMIT_TOOLS[own]],
        unlisted=[tool for kind, tool in SUBMIT_TOOLS.items() if kind != own],
    )
