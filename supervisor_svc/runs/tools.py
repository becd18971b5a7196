"""The supervisor's tools: delegate_research plus the shared scratchpad tools.

Tools see a narrow context: the run's delegation desk (anything that can
delegate one task and answer with its rendered result) and its scratchpad
access, never the run itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, Field, field_validator, model_validator

from quarry.agent.messages import ToolCall
from quarry.agent.scratchpad_tools import SCRATCHPAD_TOOLS, SourceParam
from quarry.agent.tools import Tool, ToolError, ToolRegistry, current_call
from quarry.identity import Principal
from quarry.research_plane import ResearchPlane

DELEGATE_TOOL = "delegate_research"


# The worker's bounds on a task (worker_svc.validation): a call past them is refused here, as a tool error the
# model can correct, rather than by the worker.
Criterion = Annotated[str, Field(max_length=1000)]
InputRef = Annotated[str, Field(max_length=2048)]


class DelegateParams(BaseModel):
    objective: str = Field(min_length=1, max_length=4000, description="the research task, self-contained")
    role: Literal["researcher", "scout", "extractor"] = Field(
        default="researcher",
        description="researcher: search, read and promote verified findings; scout: screen the literature and "
        "list candidate sources (reads nothing, cites nothing); extractor: take claim and experiment records out "
        "of the one source URL among input_refs",
    )
    criteria: list[Criterion] = Field(default_factory=list, max_length=10, description="what a good answer must show")
    input_refs: list[InputRef] = Field(
        default_factory=list, max_length=20, description="scratchpad entries or URLs to start from"
    )

    @field_validator("objective", "criteria", "input_refs")
    @classmethod
    def _no_nul(cls, value: str | list[str]) -> str | list[str]:
        if any("\x00" in text for text in ([value] if isinstance(value, str) else value)):
            raise ValueError("must not contain NUL characters")
        return value

    @model_validator(mode="after")
    def _an_extractor_reads_one_source(self) -> DelegateParams:
        urls = [ref for ref in self.input_refs if ref.startswith(("http://", "https://", "corpus://"))]
        if self.role == "extractor" and len(urls) != 1:
            raise ValueError("an extractor's input_refs name the one source URL it reads")
        return self


class DelegationDesk(Protocol):
    async def delegate(self, params: DelegateParams, call: ToolCall) -> str:
        """Run one delegation to its end; the text the supervisor's context keeps of it."""


@dataclass
class SupervisorContext:
    """What the supervisor's tools share during one run (it satisfies ScratchpadAccess)."""

    delegations: DelegationDesk
    scratchpad: ResearchPlane
    scratchpad_thread_id: str
    author: Principal
    promoted: list[int] = field(default_factory=list)

    def verify_sources(self, kind: str, sources: Sequence[SourceParam]) -> None:
        if sources:
            raise ToolError("the supervisor cites nothing itself; sourced findings come from workers")


async def delegate_research(params: DelegateParams, context: SupervisorContext) -> str:
    return await context.delegations.delegate(params, current_call())


SUPERVISOR_TOOLS: list[Tool[Any, SupervisorContext]] = [
    Tool(
        DELEGATE_TOOL,
        "Give one bounded task to a worker; returns its result once it ends. A researcher reads the scratchpad "
        "itself and promotes verified findings there; a scout lists candidate sources; an extractor records the "
        "claims and experiments of one source. Only researchers' findings are cited in the report.",
        DelegateParams,
        delegate_research,
    ),
    *SCRATCHPAD_TOOLS,
]
REGISTRY: ToolRegistry[SupervisorContext] = ToolRegistry(SUPERVISOR_TOOLS)
