"""A scripted verified research run: pages, a researcher's findings, and evidence roles that answer
from what their own requests carry (the finding they were shown, the sentence they were given), since
the sequence numbers they are addressed by are only known once the run has written them.

`tower_scenario` scripts one whole verified run: four findings (two supported, one overstated, one
contradicted by another finding's page), a draft of four cited sentences (one presenting the
disagreement, sound; one citing a side of it alone, objected to by the citation check and revised; one
rejected and one upheld by an adjudicator).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography, agent_of, append_finding
from tests.fakes.openai_server import Call, HttpError, Reply, Step
from tests.fakes.web_server import FixtureWeb

QUESTION = "When did the Eiffel Tower open, and how tall is it?"
# An adjudicator's "decision" that makes its model call fail: the objection is left undecided.
UNDECIDED = "undecided"
# An auditor's "judgement" that makes its model call fail: the sentence is left unaudited.
AUDIT_FAILS = "fails"
NOTES = "SUPERVISOR-NOTE: the opening date looks settled; I believe it is the tallest in the world."


def page(title: str, *paragraphs: str) -> str:
    body = "".join(f"<p>{text}</p>" for text in paragraphs)
    return f"<!doctype html><html><head><title>{title}</title></head><body><article>{body}</article></body></html>"


OPENING = ("/opening.html", "The tower opened to the public in May 1889, after two years of construction.")
HEIGHT = ("/height.html", "The tower is 330 metres tall, including its antennas.")
GUIDE = ("/guide.html", "Our guide says the tower opened in 1887, two years early.")

# The researcher's findings: the claim, the page, the excerpt it quotes.
OPENED = ("The tower opened to the public in May 1889.", OPENING, "The tower opened to the public in May 1889")
TALL = ("The tower is 330 metres tall.", HEIGHT, "The tower is 330 metres tall")
# A real quote, an overstated claim.
TALLEST = ("The tower is the tallest structure in the world.", HEIGHT, "The tower is 330 metres tall")
# Disagrees with the opening page.
EARLY = ("The tower opened in 1887.", GUIDE, "the tower opened in 1887")

# A draft on OPENED [1] and TALL [2] alone (EARLY not among the findings).
S_OPENED = "The tower opened to the public in May 1889 [1]."
# The tower scenario's draft: the citable findings are OPENED [1], TALL [2] and EARLY [3] (OPENED and EARLY
# contested: both sides of one disagreement); the unsupported one has no number.
S_DISPUTED = "The opening page says it opened to the public in May 1889 [1], while a guide says 1887 [3]."
S_WRONG = "It is 330 metres tall [1]."  # cites one side of the disagreement, and not the height: revised
S_WRONG_REVISED = "The tower is 330 metres tall [2]."
S_REJECTED = "It was the tallest iron tower of its day [2]."  # contested, then rejected by the adjudicator
S_UPHELD = "It stands 330 metres high [2]."  # objected to, contested, approved by the adjudicator
DRAFT = f"## The tower\n\n{S_DISPUTED} {S_WRONG} {S_REJECTED} {S_UPHELD}"


@dataclass
class EvidenceScript(Choreography):
    """The choreography, with the evidence roles and the reviser answering from their own requests."""

    site_url: str = ""
    verdicts: dict[str, Callable[[int, str], Step]] = field(default_factory=dict)  # by the finding's claim
    # By sentence text: (judgement, objection); AUDIT_FAILS for an auditor whose model call fails.
    audits: dict[str, tuple[str, str]] = field(default_factory=dict)
    revisions: dict[str, str] = field(default_factory=dict)  # by sentence text: the reviser's answer
    decisions: dict[str, str] = field(default_factory=dict)  # by sentence text: the adjudicator's decision
    unanswered: list[str] = field(default_factory=list)  # requests no script answered

    def __call__(self, body: dict[str, Any]) -> Step:
        agent = agent_of(body)
        handlers = {
            "Verify finding ": self._verify,
            "Audit sentence ": self._audit,
            "Adjudicate objection ": self._adjudicate,
            "Revise sentence ": self._revise,
        }
        for prefix, handler in handlers.items():
            if agent.startswith(prefix):
                self.requests.setdefault(agent, []).append(body)
                try:
                    return handler(agent, body)
                except StopIteration:  # nothing scripted for what this request carries: the test fails on it
                    self.unanswered.append(task_of(body))
                    return HttpError(400, message=f"nothing scripted for {agent!r}")
        return super().__call__(body)

    def _verify(self, agent: str, body: dict[str, Any]) -> Step:
        finding = int(agent.split()[2])
        results = [m.get("content") or "" for m in body["messages"] if m["role"] == "tool"]
        if not results:
            cited = re.search(r"It cites: (\S+?)\.\n", task_of(body))
            assert cited is not None
            calls = [Call("read_scratchpad", {}, "inputs"), Call("read_web_page", {"url": cited.group(1)}, "own")]
            if cited.group(1).endswith(GUIDE[0]):  # the other source of this research bears on the claim
                calls.append(Call("read_web_page", {"url": self.site_url + OPENING[0]}, "other"))
            return Reply(calls=tuple(calls))
        claim = next(claim for claim in self.verdicts if claim in results[0])
        return self.verdicts[claim](finding, self.site_url)

    def _audit(self, agent: str, body: dict[str, Any]) -> Step:
        index = int(agent.split()[2])
        task = task_of(body)
        refs = json.loads(re.findall(r"finding_refs (\[[\d, ]+\])", task)[-1])
        judgement, objection = next(audit for text, audit in self.audits.items() if shown(task) == text)
        if judgement == AUDIT_FAILS:
            return HttpError(400, message="the auditor's model refused the request")
        audited = {"sentence_index": index, "finding_refs": refs, "judgement": judgement, "objection": objection}
        return Reply(calls=(Call("submit_citation_audit", {"sentences": [audited]}, "audit"),))

    def _revise(self, agent: str, body: dict[str, Any]) -> Step:
        asked = json.dumps(body["messages"])
        return Reply(content=next(answer for text, answer in self.revisions.items() if json.dumps(text)[1:-1] in asked))

    def _adjudicate(self, agent: str, body: dict[str, Any]) -> Step:
        objection = int(agent.split()[2])
        task = task_of(body)
        decision = next(decision for text, decision in self.decisions.items() if shown(task) == text)
        if decision == UNDECIDED:
            return HttpError(400, message="the adjudicator's model refused the request")
        arguments = {"objection_ref": objection, "decision": decision, "rationale": f"the findings call for {decision}"}
        return Reply(calls=(Call("submit_adjudication", arguments, "decide"),))


def task_of(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user" and m["content"].startswith("Task: "))


def marked(text: str) -> str:
    """A sentence without its citation markers, as the scripts recognise it."""
    return re.sub(r" \[[^\]]*\]", "", text)


def shown(task: str) -> str:
    """The sentence an auditor's or adjudicator's task quotes, without its markers (they name findings)."""
    quoted = re.search(r'of a draft report: "(.*)"', task)
    assert quoted is not None, task
    return marked(quoted.group(1))


def verdict(judgement: str, excerpt: str, page_path: str, rationale: str) -> Callable[[int, str], Step]:
    def answer(finding: int, site_url: str) -> Step:
        arguments = {
            "finding_ref": finding,
            "judgement": judgement,
            "quote": {"url": site_url + page_path, "excerpt": excerpt},
            "rationale": rationale,
        }
        return Reply(calls=(Call("submit_claim_verdict", arguments, "verdict"),))

    return answer


def research(script: EvidenceScript, site: FixtureWeb, *findings: tuple[str, tuple[str, str], str]) -> None:
    """One researcher reads every page and promotes `findings`; the supervisor delegates it, then ends."""
    pages = sorted({path for _, (path, _), _ in findings})
    script.add(
        "Research the tower",
        Reply(
            calls=tuple(
                Call("read_web_page", {"url": site.base_url + path}, f"read-{n}") for n, path in enumerate(pages)
            )
        ),
        Reply(
            calls=tuple(
                append_finding(f"promote-{n}", claim, site.base_url + path, excerpt)
                for n, (claim, (path, _), excerpt) in enumerate(findings)
            )
        ),
        Reply(content="Promoted the findings."),
    )
    script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Research the tower"}, "d1"),)),
        Reply(content=NOTES),
    )


def add_pages(site: FixtureWeb) -> None:
    site.add(OPENING[0], page("Opening", OPENING[1]))
    site.add(HEIGHT[0], page("Height", HEIGHT[1]))
    site.add(GUIDE[0], page("A guide", GUIDE[1]))


def tower_scenario(script: EvidenceScript, site: FixtureWeb) -> None:
    """The whole verified run, scripted: research, verdicts, the draft, audits, revisions, decisions."""
    research(script, site, OPENED, TALL, TALLEST, EARLY)
    script.verdicts = {
        OPENED[0]: verdict("supported", OPENED[2], OPENING[0], "the page gives the opening date"),
        TALL[0]: verdict("supported", TALL[2], HEIGHT[0], "the page gives the height"),
        TALLEST[0]: verdict("unsupported", TALL[2], HEIGHT[0], "the page gives a height, not a ranking"),
        EARLY[0]: verdict("contradicted", OPENED[2], OPENING[0], "the opening page gives May 1889"),
    }
    script.add(REPORT, Reply(content=DRAFT, chunks=5))
    script.audits = {
        marked(S_DISPUTED): ("sound", ""),
        marked(S_WRONG_REVISED): ("sound", ""),
        marked(S_REJECTED): ("needs_revision", "the finding gives a height, not a comparison"),
        marked(S_UPHELD): ("unsound", "stands high is not what the finding says"),
    }
    script.revisions = {
        S_WRONG: S_WRONG_REVISED,
        S_REJECTED: "ADJUDICATE: the height makes it the tallest of its day",
        S_UPHELD: "ADJUDICATE: standing 330 metres high is being 330 metres tall",
    }
    script.decisions = {marked(S_REJECTED): "reject", marked(S_UPHELD): "approve"}
