"""Scripts for a whole research run: each agent of the mesh gets its own script from one scripted model.

Requests from the supervisor, its report call and each worker are told apart
by their messages (the system prompt, and a worker's task), so parallel
workers can each follow their own script whatever order their calls arrive in.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.openai_server import Call, HttpError, Step

SUPERVISOR = "supervisor"
REPORT = "report"


def append_finding(call_id: str, content: str, url: str, excerpt: str, title: str | None = None) -> Call:
    """A researcher's call promoting one finding that quotes one page."""
    source = {"url": url, "excerpt": excerpt} if title is None else {"url": url, "title": title, "excerpt": excerpt}
    return Call("append_scratchpad", {"kind": "finding", "content": content, "sources": [source]}, call_id)


def agent_of(body: dict[str, Any]) -> str:
    """SUPERVISOR, REPORT, or the objective of the worker's task."""
    messages = body["messages"]
    first = messages[0].get("content") or ""
    if "supervisor of a research team" in first:
        return SUPERVISOR
    if "final report of a research run" in first:
        return REPORT
    for message in messages:
        text = message.get("content") or ""
        if message["role"] == "user" and text.startswith("Task: "):
            return text.removeprefix("Task: ").split("\n", 1)[0]
    return "unknown"


@dataclass
class Choreography:
    scripts: dict[str, deque[Step]] = field(default_factory=dict)
    requests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    arrivals: dict[str, list[float]] = field(default_factory=dict)  # time.monotonic() of each request

    def add(self, agent: str, *steps: Step) -> None:
        self.scripts.setdefault(agent, deque()).extend(steps)

    def __call__(self, body: dict[str, Any]) -> Step:
        agent = agent_of(body)
        self.requests.setdefault(agent, []).append(body)
        self.arrivals.setdefault(agent, []).append(time.monotonic())
        steps = self.scripts.get(agent)
        if not steps:
            return HttpError(400, message=f"no script left for {agent!r}")
        return steps.popleft()

    def tool_results(self, agent: str) -> list[str]:
        """The tool results the agent's last request carried (what it had seen by then)."""
        last = self.requests[agent][-1]["messages"]
        return [m.get("content") or "" for m in last if m["role"] == "tool"]
