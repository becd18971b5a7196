"""`read_scratchpad` and `append_scratchpad`: the agent's only way into the shared research plane.

Both the supervisor and the worker carry them. Appends are idempotent: the
request_id is derived from the principal and the entry's payload, so a
delegation retried after a crash cannot promote the same finding twice. A
finding's sources are checked by the caller's verifier before anything is
written; a rejected append is an error result the model can correct.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from quarry.agent.tools import Tool, ToolError
from quarry.identity import Principal
from quarry.research_plane import ResearchPlane
from quarry.vocabulary import Entry, EntryKind, Source


class SourceParam(BaseModel):
    url: str = Field(description="the page the claim comes from, exactly as read")
    title: str = ""
    excerpt: str = Field(description="words quoted verbatim from that page")


class ReadParams(BaseModel):
    after_sequence_no: int = Field(default=0, ge=0, description="only entries after this number")


class AppendParams(BaseModel):
    kind: Literal["seed", "finding", "marker", "acknowledgement", "note", "verdict"]
    content: str = Field(min_length=1)
    sources: list[SourceParam] = Field(default_factory=list)


class ScratchpadAccess(Protocol):
    """What a run must provide to use the scratchpad tools."""

    scratchpad: ResearchPlane
    scratchpad_thread_id: str
    author: Principal
    promoted: list[int]

    def verify_sources(self, kind: str, sources: Sequence[SourceParam]) -> None:
        """Raise ToolError when a source was not read here or a quote is not in it."""


def render_entries(entries: Sequence[Entry]) -> str:
    if not entries:
        return "The scratchpad has no entries after that point."
    lines = []
    for entry in entries:
        who = f"{entry.author.principal_id} ({entry.author.role})"
        lines.append(f"[{entry.sequence_no}] {entry.kind} by {who}: {entry.content}")
        for source in entry.sources:
            lines.append(f'    source: {source.url} "{source.excerpt}"')
    return "\n".join(lines)


async def read_scratchpad(params: ReadParams, context: ScratchpadAccess) -> str:
    entries = await context.scratchpad.read_all(
        context.scratchpad_thread_id, after_sequence_no=params.after_sequence_no
    )
    return render_entries(entries)


async def append_scratchpad(params: AppendParams, context: ScratchpadAccess) -> str:
    context.verify_sources(params.kind, params.sources)
    payload = json.dumps([params.kind, params.content, [s.model_dump() for s in params.sources]], sort_keys=True)
    digest = hashlib.sha256(payload.encode()).hexdigest()[:32]
    try:
        appended = await context.scratchpad.append(
            context.scratchpad_thread_id,
            request_id=f"{context.author.principal_id}/{digest}",
            kind=EntryKind(params.kind),
            author=context.author,
            content=params.content,
            sources=[Source(url=s.url, title=s.title, excerpt=s.excerpt) for s in params.sources],
        )
    except Exception as error:  # a refusal (authority, validation) is for the model to read
        details = getattr(error, "details", None)
        raise ToolError(f"the scratchpad refused the entry: {details() if callable(details) else error}") from error
    if appended.entry.sequence_no not in context.promoted:  # a replay promotes nothing new
        context.promoted.append(appended.entry.sequence_no)
    return f"appended as entry {appended.entry.sequence_no}"


SCRATCHPAD_TOOLS: list[Tool[Any, ScratchpadAccess]] = [
    Tool(
        "read_scratchpad",
        "Read the shared research scratchpad: the seed, findings and markers other participants promoted.",
        ReadParams,
        read_scratchpad,
    ),
    Tool(
        "append_scratchpad",
        "Promote something to the shared scratchpad. A finding must cite pages you read in this task, "
        "with excerpts quoted exactly from them.",
        AppendParams,
        append_scratchpad,
        in_order=True,
    ),
]
