"""The runs recorded as replay fixtures (tests/replays/*.qrun), each scripted on the scripted model.

`python3 -m tests.replays.record` records them again, after a change that is meant to change what a run
asks its model (a prompt, a tool's description, a result's wording): replaying the old recordings then
fails at that change, which is the point of keeping them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quarry.v1 import supervisor_pb2
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography, append_finding
from tests.fakes.evidence import QUESTION, EvidenceScript, add_pages, tower_scenario
from tests.fakes.openai_server import Call, HttpError, Reply
from tests.fakes.web_server import FixtureWeb


@dataclass(frozen=True)
class Scenario:
    name: str
    question: str
    options: supervisor_pb2.RunOptions
    # Scripts the model (and adds the pages) for one run; returns the script to serve.
    script: Callable[[FixtureWeb], Choreography]


def _plain(site: FixtureWeb) -> Choreography:
    """One researcher reads a page and promotes a finding; the report cites it."""
    script = Choreography()
    url = f"{site.base_url}/history.html"
    script.add(
        "Find the opening date",
        Reply(calls=(Call("read_web_page", {"url": url}, "read"),)),
        Reply(
            calls=(append_finding("promote", "The tower opened in May 1889.", url, "opened to the public in May 1889"),)
        ),
        Reply(content="Promoted the opening date."),
    )
    script.add(
        SUPERVISOR,
        Reply(content="Delegating.", calls=(Call("delegate_research", {"objective": "Find the opening date"}, "d1"),)),
        Reply(content="The opening date is known."),
    )
    script.add(REPORT, Reply(content="The tower opened to the public in May 1889 [1].", chunks=4))
    return script


def _verified(site: FixtureWeb) -> Choreography:
    """Verified research with objections: four findings judged blind, a draft audited, one sentence revised,
    two contested and adjudicated (tests/fakes/evidence.py's tower scenario)."""
    script = EvidenceScript(site_url=site.base_url)
    add_pages(site)
    tower_scenario(script, site)
    return script


def _failed_delegation(site: FixtureWeb) -> Choreography:
    """The first researcher's model call fails for good; the supervisor delegates again and reports."""
    script = Choreography()
    url = f"{site.base_url}/history.html"
    script.add("Find the builders", HttpError(400, message="the model refused the request"))
    script.add(
        "Count the workers",
        Reply(calls=(Call("read_web_page", {"url": url}, "read"),)),
        Reply(calls=(append_finding("promote", "About 300 workers built it.", url, "About three hundred workers"),)),
        Reply(content="Promoted the head count."),
    )
    script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Find the builders"}, "d1"),)),
        Reply(calls=(Call("delegate_research", {"objective": "Count the workers"}, "d2"),)),
        Reply(content="One task failed; the other answered."),
    )
    script.add(REPORT, Reply(content="About three hundred workers built the tower [1].", chunks=2))
    return script


SCENARIOS = [
    Scenario("plain", "When did the Eiffel Tower open?", supervisor_pb2.RunOptions(), _plain),
    Scenario(
        "verified_with_objections",
        QUESTION,
        supervisor_pb2.RunOptions(verification=supervisor_pb2.VERIFICATION_MODE_ON),
        _verified,
    ),
    Scenario("failed_delegation", "Who built the Eiffel Tower?", supervisor_pb2.RunOptions(), _failed_delegation),
]
