"""The draft report's review over real gRPC with the scripted model: blind audits, revision, adjudication.

A scratchpad and a worker run in this process; the supervisor side is the run's own delegation desk
and its model client, as a run wires them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from quarry.agent.model import ModelClient, ModelSettings
from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.db import Database
from quarry.identity import Principal, Role
from quarry.migrations import upgrade_schema_async
from quarry.notify import CommitSignal
from quarry.records.fold import fold_ledger
from quarry.records.research import CitationCheck, Objection, ObjectionResolution, Resolution, parse_record
from quarry.records.verification import ObjectionState, ObjectionStatus, SentenceStatus, Verification
from quarry.research_plane import ResearchPlane
from quarry.vocabulary import EntryKind, Source
from supervisor_svc.runs.budget import RunAccount, TokenBudget
from supervisor_svc.runs.delegating import Delegator
from supervisor_svc.runs.domain import Report, StartRequest
from supervisor_svc.runs.ledger import RunLedger
from supervisor_svc.runs.publishing import RunEventLog, RunPublisher
from supervisor_svc.runs.store import RunStore
from supervisor_svc.runs.synthesis import CitationFilter, verified_sources
from supervisor_svc.runs.worker_client import DelegationClient
from supervisor_svc.service import MIGRATIONS, VERSION_TABLE
from supervisor_svc.verification.checks import Contested
from supervisor_svc.verification.report import with_verification
from supervisor_svc.verification.resolutions import approve_open_objections
from supervisor_svc.verification.review import ReviewDesk, ReviewedReport, ReviewRequest, ReviewStage, review_report
from supervisor_svc.verification.revision import REVISER_INSTRUCTIONS
from tests.fakes.choreography import Choreography, agent_of
from tests.fakes.openai_server import Call, HttpError, Reply, ScriptedModel, Step
from tests.fakes.web_server import FixtureWeb
from tests.worker_svc.test_delegate import in_process

RUN_ID = "run-" + "c" * 32
QUESTION = "What is known about the Eiffel Tower?"
PAGE = "https://history.example/eiffel"
# Entry 1 is the run's seed; the findings are 2, 3 and 4, cited as sources [1], [2] and [3].
FINDINGS = [
    ("The tower opened to the public in May 1889.", "the tower opened to the public in May 1889"),
    ("About three hundred workers built the tower.", "About three hundred workers joined together"),
    ("The tower is the tallest iron tower of its time.", "the tallest iron structure of its day"),
]
OPENED = "The tower opened to the public in 1889 [1]."
WORKERS = "Some three hundred workers built it [1]."  # cites the opening, not the workers
WORKERS_REVISED = "Some three hundred workers built it [2]."
TALLEST = "It was the tallest iron tower of its day [3]."
GOLD = "It was painted gold in 1900 [3]."
DRAFT = f"# The Eiffel Tower\n\n{OPENED} {WORKERS}\n\n- {TALLEST}\n- {GOLD}\n"
TALLEST_REVISED = "It was the tallest iron structure of its day [3]."
CONTEST = "ADJUDICATE: the finding says tallest iron structure, which is what the sentence says"


@dataclass
class Script(Choreography):
    """The choreography, with each adjudicator deciding as `decisions` says for the sentence its task names
    (an objection's number is only known once the auditor has recorded it)."""

    decisions: dict[int, str] = field(default_factory=dict)

    def __call__(self, body: dict[str, Any]) -> Step:
        agent = agent_of(body)
        if not agent.startswith("Adjudicate objection "):
            return super().__call__(body)
        self.requests.setdefault(agent, []).append(body)
        sentence = re.search(r"against sentence (\d+)", json.dumps(body["messages"]))
        decision = self.decisions.get(int(sentence.group(1))) if sentence else None
        if decision is None:
            return HttpError(400, message=f"no decision for {agent!r}")
        arguments = {"objection_ref": int(agent.split()[-1]), "decision": decision, "rationale": f"{decision}d"}
        return Reply(calls=(Call("submit_adjudication", arguments, "decide"),))


@dataclass
class Desk:
    script: Script
    plane: ResearchPlane
    delegator: Delegator
    ledger: RunLedger
    model: ModelClient
    budget: TokenBudget
    thread_id: str
    statuses: list[tuple[ReviewStage, str]]

    async def review(
        self,
        markdown: str,
        *,
        rounds: int = 2,
        leave_unsettled_open: bool = False,
        contested: Contested | None = None,
    ) -> ReviewedReport:
        """Review `markdown` as the model wrote it: through the citation filter first, as a run's draft is."""
        entries = await self.plane.read_all(self.thread_id)
        sources = verified_sources(entries)
        citations = CitationFilter({source.number: source for source in sources})
        draft = citations.feed(markdown) + citations.finish()

        async def status(stage: ReviewStage, message: str) -> None:
            self.statuses.append((stage, message))

        request = ReviewRequest(
            question=QUESTION,
            draft=Report(draft, tuple(sources), citations.removed, invalid_markers=tuple(citations.invalid_at)),
            sources=sources,
            claims={e.sequence_no: e.content for e in entries if e.kind is EntryKind.FINDING},
            contested=contested or {},
            max_revision_rounds=rounds,
            leave_unsettled_open=leave_unsettled_open,
        )
        reviewed = await review_report(
            request, ReviewDesk(RUN_ID, self.delegator, self.ledger, self.model, self.budget, status)
        )
        # What the review decided is what its ledger folds to (what GetRun serves).
        folded = fold_ledger(await self.plane.read_all(self.thread_id))
        assert (folded.sentences, folded.objections, folded.revision_rounds) == (
            reviewed.sentences,
            reviewed.objections,
            reviewed.revision_rounds,
        )
        return reviewed

    async def approve(self, verification: Verification, comment: str) -> Verification:
        approved = await approve_open_objections(verification, comment, "alice", self.ledger)
        folded = fold_ledger(await self.plane.read_all(self.thread_id))
        assert (folded.sentences, folded.objections) == (approved.sentences, approved.objections)
        return approved

    async def raised_by_checks(self) -> list[Objection]:
        """The objections the supervisor's citation checks recorded, in ledger order."""
        found = []
        for entry in await self.plane.read_all(self.thread_id):
            if entry.kind is EntryKind.OBJECTION and entry.author.role is Role.SUPERVISOR:
                record = parse_record(entry.kind, entry.content)
                assert isinstance(record, Objection)
                found.append(record)
        return found

    async def resolutions(self) -> list[ObjectionResolution]:
        found = []
        for entry in await self.plane.read_all(self.thread_id):
            if entry.kind is EntryKind.RESOLUTION:
                assert entry.author == Principal(RUN_ID, Role.SUPERVISOR)
                record = parse_record(entry.kind, entry.content)
                assert isinstance(record, ObjectionResolution)
                found.append(record)
        return found


@pytest.fixture
async def desk(tmp_path: Path, model: ScriptedModel, site: FixtureWeb) -> AsyncIterator[Desk]:
    script = Script()
    model.default = script
    url = f"sqlite:///{tmp_path / 'supervisor.db'}"
    await upgrade_schema_async(url, MIGRATIONS, VERSION_TABLE)
    database = Database(url)
    store = RunStore(database)
    await store.create(RUN_ID, StartRequest(QUESTION), scratchpad_thread_id=RUN_ID, owner="test")
    client = ModelClient(ModelSettings(base_url=model.base_url, model="scripted", retry_budget=5))
    async with (
        in_process(tmp_path, model, site, True) as (scratchpad_address, worker_address, _),
        insecure_channel(scratchpad_address) as channel,
    ):
        plane = ResearchPlane(ScratchpadClient(channel))
        await plane.create_thread(RUN_ID, title="eiffel", request_id="thread")
        supervisor = Principal(RUN_ID, Role.SUPERVISOR)
        await plane.append(RUN_ID, kind=EntryKind.SEED, author=supervisor, content=QUESTION, request_id="seed")
        for n, (claim, excerpt) in enumerate(FINDINGS):
            await plane.append(
                RUN_ID,
                kind=EntryKind.FINDING,
                author=Principal(f"researcher-{n}", Role.RESEARCHER),
                content=claim,
                sources=(Source(url=PAGE, title="The tower", excerpt=excerpt),),
                request_id=f"finding-{n}",
            )
        workers = DelegationClient([worker_address])
        account = RunAccount()
        budget = TokenBudget(0, account)
        publisher = RunPublisher(RunEventLog(store, CommitSignal(), RUN_ID), plane, RUN_ID, RUN_ID)
        ledger = RunLedger(plane, RUN_ID, RUN_ID)  # the run's one ledger: the delegator's and the review's
        delegator = Delegator(
            run_id=RUN_ID,
            thread_id=RUN_ID,
            max_worker_turns=4,
            parallel=2,
            deadline=time.monotonic() + 60,
            client=workers,
            scratchpad=plane,
            account=account,
            budget=budget,
            publisher=publisher,
            ledger=ledger,
        )
        try:
            yield Desk(script, plane, delegator, ledger, client, budget, RUN_ID, [])
        finally:
            await workers.close()
            await client.close()
            await database.close()


def audit(index: int, findings: list[int], judgement: str = "sound", objection: str = "") -> Reply:
    sentence: dict[str, Any] = {"sentence_index": index, "finding_refs": findings, "judgement": judgement}
    if objection:
        sentence["objection"] = objection
    return Reply(calls=(Call("submit_citation_audit", {"sentences": [sentence]}, f"audit-{index}"),))


def seen(requests: list[dict[str, Any]]) -> str:
    return json.dumps([request["messages"] for request in requests])


async def test_objections_are_settled_by_revision_and_by_adjudication(desk: Desk) -> None:
    script = desk.script
    # Entries 1-4 are the seed and findings. Each delegation's ledger writes an assignment, a route and
    # its usage around what the worker records, so the objections' numbers come from the results.
    script.add("Audit sentence 1", audit(1, [2]))
    script.add("Audit sentence 2", audit(2, [2], "unsound", "Finding 2 is about the opening, not the workers."))
    script.add("Audit sentence 3", audit(3, [4], "needs_revision", "Finding 4 says structure, not tower."))
    script.add("Audit sentence 4", audit(4, [4], "unsound", "No finding mentions gold paint."))
    script.add("Revise sentence 2", Reply(content=WORKERS_REVISED))
    script.add("Audit sentence 2 (revision 1)", audit(2, [3]))
    script.add("Revise sentence 3", Reply(content=CONTEST))
    script.add("Revise sentence 4", Reply(content="ADJUDICATE: it was gold, trust me"))

    script.decisions.update({3: "approve", 4: "reject"})

    reviewed = await desk.review(DRAFT)

    assert reviewed.report.markdown == f"# The Eiffel Tower\n\n{OPENED} {WORKERS_REVISED}\n\n- {TALLEST}\n"
    assert [c.number for c in reviewed.report.citations] == [1, 2, 3]
    statuses = {
        check.sentence_index: (check.status, check.text, check.finding_sequence_nos) for check in reviewed.sentences
    }
    assert statuses == {
        1: (SentenceStatus.SOUND, OPENED, (2,)),
        2: (SentenceStatus.REVISED, WORKERS_REVISED, (3,)),
        3: (SentenceStatus.UPHELD, TALLEST, (4,)),
        4: (SentenceStatus.REMOVED, GOLD, (4,)),
    }
    assert reviewed.revision_rounds == 1
    by_sentence = {o.sentence_index: o for o in reviewed.objections}
    assert [by_sentence[i].status for i in (2, 3, 4)] == [
        ObjectionStatus.REVISED,
        ObjectionStatus.DISMISSED,
        ObjectionStatus.SENTENCE_REMOVED,
    ]
    assert by_sentence[3].adjudication_sequence_no and by_sentence[4].adjudication_sequence_no
    assert not by_sentence[2].adjudication_sequence_no

    # The ledger holds one resolution per objection, written by the supervisor.
    resolutions = {r.objection_ref: r for r in await desk.resolutions()}
    assert set(resolutions) == {o.objection_sequence_no for o in reviewed.objections}
    revised = resolutions[by_sentence[2].objection_sequence_no]
    assert (revised.resolution, revised.sentence) == (Resolution.REVISED, WORKERS_REVISED)
    assert revised.audit_ref == reviewed.sentences[1].audit_sequence_nos[-1]
    dismissed = resolutions[by_sentence[3].objection_sequence_no]
    assert (dismissed.resolution, dismissed.adjudication_ref) == (
        Resolution.DISMISSED,
        by_sentence[3].adjudication_sequence_no,
    )
    assert resolutions[by_sentence[4].objection_sequence_no].resolution is Resolution.SENTENCE_REMOVED
    assert all(o.resolution_sequence_no for o in reviewed.objections)

    # Blind: each auditor saw its own sentence, its markers naming findings, and no other sentence.
    sentences = {
        1: "opened to the public in 1889 [finding 2]",
        2: "three hundred workers built it [finding 2]",
        3: "tallest iron tower of its day [finding 4]",
        4: "painted gold in 1900 [finding 4]",
    }
    for index, own in sentences.items():
        text = seen(script.requests[f"Audit sentence {index}"])
        assert own in text and QUESTION in text
        others = [other.split(" [")[0] for n, other in sentences.items() if n != index]
        assert not [other for other in others if other in text], index
    assert "workers built it [finding 3]" in seen(script.requests["Audit sentence 2 (revision 1)"])
    # The adjudicator never learns why the supervisor contested.
    assert "trust me" not in seen(script.requests[f"Adjudicate objection {by_sentence[4].objection_sequence_no}"])
    # The reviser is the supervisor's model with its own instructions, given the objection.
    reviser = script.requests["Revise sentence 2"][0]["messages"]
    assert reviser[0]["content"] == REVISER_INSTRUCTIONS and "not the workers" in reviser[1]["content"]
    assert [stage for stage, _ in desk.statuses] == [
        ReviewStage.AUDITING,
        ReviewStage.REVISING,
        ReviewStage.ADJUDICATING,
    ]


async def test_what_is_left_unsettled_leaves_the_report_and_an_unjudged_sentence_stands_unaudited(
    desk: Desk,
) -> None:
    script = desk.script
    # Sentence 1's auditor has no script: its model call fails, and so does the delegation.
    script.add("Audit sentence 2", audit(2, [2], "unsound", "Finding 2 is about the opening."))
    script.add("Audit sentence 3", audit(3, [4], "unsound", "Tower, not structure."))
    script.add("Audit sentence 4", audit(4, [4], "unsound", "Gold is not in finding 4."))
    script.add("Revise sentence 2", Reply(content="REMOVE"))
    script.add("Revise sentence 4", Reply(content=CONTEST))  # and its adjudicator has no decision: it fails
    script.add("Revise sentence 3", Reply(content="It was the tallest iron structure of its day [3]."))
    script.add("Audit sentence 3 (revision 1)", audit(3, [4], "needs_revision", "Of its day is not in the finding."))
    script.decisions[3] = "revise"

    reviewed = await desk.review(DRAFT, rounds=1)

    # The sentence no auditor judged stays, marked as unverified where it stands.
    assert reviewed.report.markdown == f"# The Eiffel Tower\n\n(unverified) {OPENED}\n"
    statuses = {check.sentence_index: check.status for check in reviewed.sentences}
    assert statuses == {
        1: SentenceStatus.UNAUDITED,
        2: SentenceStatus.REMOVED,
        3: SentenceStatus.REMOVED,
        4: SentenceStatus.REMOVED,
    }
    # Sentence 3 drew two objections (the draft's and its revision's): one adjudication, both closed.
    third = [o for o in reviewed.objections if o.sentence_index == 3]
    assert len(third) == 2 and {o.status for o in third} == {ObjectionStatus.SENTENCE_REMOVED}
    assert [bool(o.adjudication_sequence_no) for o in third] == [False, True]
    assert len(script.requests[f"Adjudicate objection {third[1].objection_sequence_no}"]) == 1
    resolutions = {r.objection_ref: r for r in await desk.resolutions()}
    assert set(resolutions) == {o.objection_sequence_no for o in reviewed.objections}
    earlier, last = (resolutions[o.objection_sequence_no] for o in third)
    assert last.sentence == earlier.sentence == "It was the tallest iron structure of its day [3]."
    assert "no round was left" in last.reason and "earlier version" in earlier.reason
    withdrawn = next(o for o in reviewed.objections if o.sentence_index == 2)
    assert "withdrew" in resolutions[withdrawn.objection_sequence_no].reason
    assert "Adjudicate objection " + str(withdrawn.objection_sequence_no) not in script.requests
    undecided = next(o for o in reviewed.objections if o.sentence_index == 4)
    assert "no adjudicator could decide" in resolutions[undecided.objection_sequence_no].reason

    # Each resolution's request id names the run and the objection, so a retried append writes nothing twice.
    entries = await desk.plane.read_all(desk.thread_id)
    assert sorted(e.request_id for e in entries if e.kind is EntryKind.RESOLUTION) == sorted(
        f"{RUN_ID}/resolution/{o.objection_sequence_no}" for o in reviewed.objections
    )


async def test_with_a_person_to_decide_what_the_review_cannot_settle_stays_open_until_they_approve(desk: Desk) -> None:
    script = desk.script
    script.add("Audit sentence 1", audit(1, [2]))
    script.add("Audit sentence 2", audit(2, [2], "unsound", "Finding 2 is about the opening."))
    script.add("Audit sentence 3", audit(3, [4], "unsound", "Tower, not structure."))
    script.add("Audit sentence 4", audit(4, [4], "unsound", "Gold is not in finding 4."))
    script.add("Revise sentence 2", Reply(content="REMOVE"))  # settled: the supervisor withdraws it
    script.add("Revise sentence 3", Reply(content=TALLEST_REVISED))
    script.add("Audit sentence 3 (revision 1)", audit(3, [4], "needs_revision", "Of its day is not in the finding."))
    script.decisions[3] = "revise"  # with no round left
    script.add("Revise sentence 4", Reply(content=CONTEST))  # and its adjudicator has no decision: it fails

    reviewed = await desk.review(DRAFT, rounds=1, leave_unsettled_open=True)

    # The unsettled sentences stay in the report (the revision as its open objection judged it).
    assert reviewed.report.markdown == f"# The Eiffel Tower\n\n{OPENED}\n\n- {TALLEST_REVISED}\n- {GOLD}\n"
    statuses = {check.sentence_index: (check.status, check.text) for check in reviewed.sentences}
    assert statuses == {
        1: (SentenceStatus.SOUND, OPENED),
        2: (SentenceStatus.REMOVED, WORKERS),
        3: (SentenceStatus.OBJECTED, TALLEST_REVISED),
        4: (SentenceStatus.OBJECTED, GOLD),
    }
    by_sentence: dict[int, list[ObjectionState]] = {}
    for objection in reviewed.objections:
        by_sentence.setdefault(objection.sentence_index, []).append(objection)
    assert [o.status for o in by_sentence[2]] == [ObjectionStatus.SENTENCE_REMOVED]
    assert [o.status for o in by_sentence[3] + by_sentence[4]] == [ObjectionStatus.OPEN] * 3
    assert [bool(o.adjudication_sequence_no) for o in by_sentence[3]] == [False, True]  # it asked for a revision
    assert not any(o.resolution_sequence_no for o in by_sentence[3] + by_sentence[4])
    # Only the settled objection has its resolution on the ledger.
    assert [r.objection_ref for r in await desk.resolutions()] == [by_sentence[2][0].objection_sequence_no]

    verification = Verification(enabled=True, sentences=reviewed.sentences, objections=reviewed.objections)
    approved = await desk.approve(verification, "I read the page myself.")

    assert approved.open_objections == ()
    assert {c.sentence_index: c.status for c in approved.sentences} == {
        1: SentenceStatus.SOUND,
        2: SentenceStatus.REMOVED,
        3: SentenceStatus.APPROVED_OVER_OBJECTION,
        4: SentenceStatus.APPROVED_OVER_OBJECTION,
    }
    closed = [o for o in approved.objections if o.sentence_index in (3, 4)]
    assert {o.status for o in closed} == {ObjectionStatus.APPROVED_BY_PERSON} and all(
        o.resolution_sequence_no for o in closed
    )
    resolutions = {r.objection_ref: r for r in await desk.resolutions()}
    assert set(resolutions) == {o.objection_sequence_no for o in approved.objections}
    for objection in closed:
        resolution = resolutions[objection.objection_sequence_no]
        assert resolution.resolution is Resolution.APPROVED_BY_PERSON
        assert resolution.reason == "approved over the objection by alice: I read the page myself."
        assert resolution.adjudication_ref is None
        assert resolution.sentence == statuses[objection.sentence_index][1]
    stated = with_verification(reviewed.report, approved).markdown
    assert f"\u201c{TALLEST_REVISED[:-5]}.\u201d (finding 4): not supported: the review left" in stated
    assert stated.count("a person approved the run over it") == 2
    # Nothing open: nothing to approve, nothing written.
    assert await desk.approve(approved, "again") == approved
    assert len(await desk.resolutions()) == len(resolutions)


async def test_a_marker_naming_no_source_raises_an_objection_that_only_a_checked_revision_settles(desk: Desk) -> None:
    """[9] names no source: the filter cuts it, and its sentence (left with no citation, or with one) is
    objected to by the code, not audited as if it were sound; a contest does not reach an adjudicator."""
    script = desk.script
    uncited = "It was painted gold in 1900 [9]."
    half = "Some three hundred workers built it [2, 9]."
    script.add("Audit sentence 1", audit(1, [2]))
    script.add("Revise sentence 2", Reply(content=CONTEST))
    script.add("Revise sentence 2 (round 2)", Reply(content="REMOVE"))
    script.add("Revise sentence 3", Reply(content=WORKERS_REVISED))
    script.add("Audit sentence 3 (revision 1)", audit(3, [3]))

    reviewed = await desk.review(f"# The Eiffel Tower\n\n{OPENED} {uncited} {half}\n")

    assert reviewed.report.markdown == f"# The Eiffel Tower\n\n{OPENED} {WORKERS_REVISED}\n"
    statuses = {check.sentence_index: (check.status, check.text) for check in reviewed.sentences}
    assert statuses == {
        1: (SentenceStatus.SOUND, OPENED),
        2: (SentenceStatus.REMOVED, "It was painted gold in 1900 ."),
        3: (SentenceStatus.REVISED, WORKERS_REVISED),
    }
    raised = await desk.raised_by_checks()
    assert [(o.check, o.sentence_index, o.finding_refs, o.audit_ref) for o in raised] == [
        (CitationCheck.INVALID_MARKER, 2, (), None),
        (CitationCheck.INVALID_MARKER, 3, (3,), None),
    ]
    assert "left with no citation" in raised[0].reason
    resolved = {r.sentence_index: (r.resolution, r.reason) for r in await desk.resolutions()}
    assert resolved == {
        2: (Resolution.SENTENCE_REMOVED, "the supervisor withdrew the sentence"),  # in round 2, after its contest
        3: (Resolution.REVISED, ""),
    }
    # No auditor judged the flagged draft sentences, and no adjudicator was asked about a check.
    assert "Audit sentence 2" not in script.requests and "Audit sentence 3" not in script.requests
    assert not any(agent.startswith("Adjudicate") for agent in script.requests)


async def test_one_side_of_a_contradiction_cited_alone_is_objected_to_and_a_revision_must_cite_both(
    desk: Desk,
) -> None:
    """Findings 2 and 4 are both sides of a disagreement: citing [1] alone states one side as fact."""
    script = desk.script
    one_sided = "The tower opened to the public in 1889 [1]."
    still_one_sided = "The tower surely opened in May 1889 [1]."
    both = "One source says it opened in 1889 [1], and another calls it the tallest of its day [3]."
    script.add("Revise sentence 0", Reply(content=still_one_sided))
    script.add("Revise sentence 0 (round 2)", Reply(content=both))
    script.add("Audit sentence 0 (revision 2)", audit(0, [2, 4]))
    script.add("Audit sentence 1", audit(1, [3]))

    reviewed = await desk.review(f"{one_sided} {WORKERS_REVISED}\n", contested={2: frozenset({4}), 4: frozenset({2})})

    assert reviewed.report.markdown == f"{both} {WORKERS_REVISED}\n"
    assert {c.sentence_index: c.status for c in reviewed.sentences} == {
        0: SentenceStatus.REVISED,
        1: SentenceStatus.SOUND,
    }
    assert reviewed.revision_rounds == 2  # the first revision was one-sided too: not audited, still open
    [raised] = await desk.raised_by_checks()
    assert (raised.check, raised.sentence_index) == (CitationCheck.ONE_SIDED, 0)
    assert "finding 2" in raised.reason and "finding 4" in raised.reason
    assert "Audit sentence 0 (revision 1)" not in script.requests and "Audit sentence 0" not in script.requests
