"""Claim verification over real gRPC with the scripted model: a blind verifier per finding, and a report
that cites only what a verifier supported.

The scratchpad holds a run's research: the seed, a supervisor's note, and four researchers' findings —
one whose quote is real but whose claim says more than it (unsupported), one another finding's page
contradicts, one supported, and one whose verifier fails. A real worker runs each verifier's contract.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from quarry.agent.model import ModelClient, ModelSettings
from quarry.agent.usage import Usage
from quarry.clients.channels import insecure_channel
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import QuarrySettings, ScratchpadSettings
from quarry.db import Database
from quarry.identity import Principal, Role
from quarry.migrations import upgrade_schema_async
from quarry.notify import CommitSignal
from quarry.records.fold import fold_ledger
from quarry.records.research import (
    BibliographicJudgement,
    BibliographicVerdict,
    ClaimJudgement,
    ClaimRefusal,
    ClaimVerdict,
    VerifiedQuote,
    parse_record,
)
from quarry.records.verification import Contradiction, FindingCheck, Verification
from quarry.research_plane import ResearchPlane
from quarry.vocabulary import DelegationErrorCode, DelegationResult, Entry, EntryKind, Source
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.runs.budget import RunAccount, TokenBudget
from supervisor_svc.runs.delegating import Delegator, EarlierOrders
from supervisor_svc.runs.domain import StartRequest
from supervisor_svc.runs.ledger import RunLedger
from supervisor_svc.runs.publishing import RunEventLog, RunPublisher
from supervisor_svc.runs.resumption import PriorDelegations
from supervisor_svc.runs.store import RunStore
from supervisor_svc.runs.synthesis import (
    VERIFIED_INSTRUCTIONS,
    ResearchEnd,
    synthesis_messages,
    verified_sources,
    write_report,
)
from supervisor_svc.runs.worker_client import DelegationClient
from supervisor_svc.service import MIGRATIONS, VERSION_TABLE
from supervisor_svc.verification.claims import (
    CRITERIA,
    MAX_INPUT_REFS,
    agreed,
    fold_verdict,
    missing_specifics,
    verifier_contract,
    verify_claims,
)
from tests.fakes.choreography import REPORT, Choreography
from tests.fakes.literature_server import Literature
from tests.fakes.openai_server import Await, Call, HttpError, Reply, ScriptedModel
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.conftest import worker_settings
from worker_svc.service import build_host as build_worker

RUN_ID = "run-" + "c" * 32
QUESTION = "When did the Eiffel Tower open, and how tall is it?"
NOTES = "Supervisor's conclusion: the tower is the tallest structure in the world and opened in 1887."
# Findings 3 to 6, after the seed (1) and the supervisor's note (2).
OVERSTATED, CONTRADICTED, SUPPORTED, FAILING = 3, 4, 5, 6
TALLEST = "The Eiffel Tower is the tallest structure in the world, at 330 metres."
OPENED_1887 = "The Eiffel Tower opened in 1887."
OPENED_1889 = "The Eiffel Tower opened to the public in May 1889."
WORKERS = "About three hundred workers built the tower."
HEIGHT_QUOTE = "The tower is 330 metres tall."
RUMOUR_QUOTE = "The tower opened in 1887."
OPENING_QUOTE = "The tower opened to the public in May 1889."
UNSUPPORTED_WHY = "The page gives the height; it never says the tower is the tallest structure in the world."
CONTRADICTED_WHY = "Another source gives May 1889 for the opening, not 1887."
SUPPORTED_WHY = "The page gives the opening as May 1889."


@dataclass
class Research:
    """A run's scratchpad after its research phase, and the parts that verify it."""

    script: Choreography
    plane: ResearchPlane
    delegator: Delegator
    account: RunAccount
    publisher: RunPublisher
    writer: ModelClient
    pages: dict[str, str]
    entries: list[Entry]
    progress: list[str]
    client: DelegationClient

    async def verify(self) -> Verification:
        """Verify the findings; what comes back is also what the ledger folds to (what GetRun would serve)."""

        async def progress(message: str) -> None:
            self.progress.append(message)

        verified = await verify_claims(
            QUESTION, self.entries, self.delegator, RunLedger(self.plane, RUN_ID, RUN_ID), progress
        )
        assert fold_ledger(await self.thread()) == verified
        return verified

    async def thread(self) -> list[Entry]:
        return await self.plane.read_all(RUN_ID)


async def verdicts_recorded(plane: ResearchPlane, count: int) -> AsyncIterator[Entry]:
    """The thread's first `count` verdicts, as they commit."""
    seen = 0
    async for entry in plane.watch(RUN_ID):
        if entry.kind is EntryKind.VERDICT:
            yield entry
            seen += 1
            if seen == count:
                return


def page(text: str) -> str:
    return f"<!doctype html><html><head><title>Tower</title></head><body><article><p>{text}</p></article></body></html>"


@pytest.fixture
async def research(tmp_path: Path, model: ScriptedModel, site: FixtureWeb) -> AsyncIterator[Research]:
    async with Literature() as literature:
        async for research in _research(tmp_path, model, site, literature):
            yield research


async def _research(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, literature: Literature
) -> AsyncIterator[Research]:
    script = Choreography()
    model.default = script
    pages = {
        "height": site.add("/height.html", page(f"{HEIGHT_QUOTE} It stands on the Champ de Mars.")),
        "rumour": site.add("/rumour.html", page(f"{RUMOUR_QUOTE} Or so the leaflet says.")),
        "opening": site.add("/opening.html", page(f"Construction began in 1887. {OPENING_QUOTE}")),
        "workers": site.add("/workers.html", page("About three hundred workers joined the pieces.")),
    }
    url = f"sqlite:///{tmp_path / 'supervisor.db'}"
    await upgrade_schema_async(url, MIGRATIONS, VERSION_TABLE)
    database = Database(url)
    store = RunStore(database)
    await store.create(RUN_ID, StartRequest(QUESTION), scratchpad_thread_id=RUN_ID, owner="test")
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1)
    writer = ModelClient(ModelSettings(base_url=model.base_url, model="scripted"))
    async with await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common) as scratchpad:
        settings = worker_settings("127.0.0.1:0", tmp_path / "worker.db", scratchpad.address, model, site)
        # Its bibliographic verifiers look papers up in arXiv's API, answered by the literature fake.
        settings = settings.model_copy(update={"arxiv_url": literature.base_url, "literature_catalogues": "arxiv"})
        async with await build_worker(settings, common) as worker, insecure_channel(scratchpad.address) as channel:
            plane = ResearchPlane(ScratchpadClient(channel))
            await plane.create_thread(RUN_ID, title=QUESTION, request_id=f"{RUN_ID}/thread")
            supervisor = Principal(RUN_ID, Role.SUPERVISOR)
            await plane.append(
                RUN_ID, kind=EntryKind.SEED, author=supervisor, content=f"Research question: {QUESTION}", request_id="s"
            )
            await plane.append(RUN_ID, kind=EntryKind.NOTE, author=supervisor, content=NOTES, request_id="n")
            for n, (claim, where, quote) in enumerate(
                [
                    (TALLEST, "height", HEIGHT_QUOTE),
                    (OPENED_1887, "rumour", RUMOUR_QUOTE),
                    (OPENED_1889, "opening", OPENING_QUOTE),
                    (WORKERS, "workers", "About three hundred workers"),
                ]
            ):
                await plane.append(
                    RUN_ID,
                    kind=EntryKind.FINDING,
                    author=Principal(f"researcher-{n}", Role.RESEARCHER),
                    content=claim,
                    sources=(Source(pages[where], "Tower", quote),),
                    request_id=f"f{n}",
                )
            account = RunAccount()
            publisher = RunPublisher(RunEventLog(store, CommitSignal(), RUN_ID), plane, RUN_ID, RUN_ID)
            client = DelegationClient([worker.address])
            delegator = Delegator(
                run_id=RUN_ID,
                thread_id=RUN_ID,
                max_worker_turns=0,
                parallel=4,
                deadline=time.monotonic() + 60,
                client=client,
                scratchpad=plane,
                account=account,
                budget=TokenBudget(0, account),
                publisher=publisher,
                ledger=RunLedger(plane, RUN_ID, RUN_ID),
            )
            entries = await plane.read_all(RUN_ID)
            yield Research(script, plane, delegator, account, publisher, writer, pages, entries, [], client)
            await client.close()
    await writer.close()
    await database.close()


def verdict(finding: int, judgement: str, url: str, excerpt: str, why: str) -> Call:
    arguments = {"finding_ref": finding, "judgement": judgement, "quote": {"url": url, "excerpt": excerpt}}
    return Call("submit_claim_verdict", {**arguments, "rationale": why}, "submit")


def reads(*urls: str) -> Reply:
    pages = (Call("read_web_page", {"url": url}, f"page{n}") for n, url in enumerate(urls))
    return Reply(calls=(Call("read_scratchpad", {}, "inputs"), *pages))


def script_verifiers(research: Research, hold: asyncio.Event | None = None) -> None:
    """Each finding's verifier, told apart by its task's first line. With `hold`, the supported finding's
    verifier starts reading only once it is set."""
    pages, script = research.pages, research.script
    script.add(
        f"Verify finding {OVERSTATED}",
        reads(pages["height"]),
        Reply(calls=(verdict(OVERSTATED, "unsupported", pages["height"], HEIGHT_QUOTE, UNSUPPORTED_WHY),)),
    )
    script.add(
        f"Verify finding {CONTRADICTED}",
        reads(pages["rumour"], pages["opening"]),
        Reply(calls=(verdict(CONTRADICTED, "contradicted", pages["opening"], OPENING_QUOTE, CONTRADICTED_WHY),)),
    )
    first = reads(pages["opening"])
    script.add(
        f"Verify finding {SUPPORTED}",
        first if hold is None else Await(hold, first),
        Reply(calls=(verdict(SUPPORTED, "supported", pages["opening"], OPENING_QUOTE, SUPPORTED_WHY),)),
    )
    script.add(f"Verify finding {FAILING}", HttpError(400, message="the verifier's model refused"))


async def test_each_finding_is_judged_blind_and_the_report_cites_only_supported_ones(
    research: Research,
) -> None:
    script_verifiers(research)
    verification = await research.verify()

    checks = {check.finding_sequence_no: check for check in verification.findings}
    assert {n: check.judgement for n, check in checks.items()} == {
        OVERSTATED: ClaimJudgement.UNSUPPORTED,  # the quote is real, the claim says more than it
        CONTRADICTED: ClaimJudgement.CONTRADICTED,
        SUPPORTED: ClaimJudgement.SUPPORTED,
        FAILING: None,  # its verifier failed: unverified
    }
    # The contradicted finding and the supported one whose page says otherwise are both sides of one
    # disagreement: both contested, both citable (only together, which the review's citation check enforces).
    assert verification.enabled and verification.citable_findings() == {SUPPORTED, CONTRADICTED}
    assert verification.contested() == {CONTRADICTED: {SUPPORTED}, SUPPORTED: {CONTRADICTED}}
    assert checks[FAILING].rationale == "not verified: the verifier failed (provider_error)"
    assert checks[OVERSTATED] == FindingCheck(
        OVERSTATED,
        TALLEST,
        ClaimJudgement.UNSUPPORTED,
        verdict_sequence_no=checks[OVERSTATED].verdict_sequence_no,
        rationale=UNSUPPORTED_WHY,
        quote_url=research.pages["height"],
        quote_excerpt=HEIGHT_QUOTE,
    )
    # Each verdict is the verifier's own entry on the ledger.
    thread = {entry.sequence_no: entry for entry in await research.thread()}
    for n in (OVERSTATED, CONTRADICTED, SUPPORTED):
        recorded = thread[checks[n].verdict_sequence_no]
        assert (recorded.kind, recorded.author.role) == (EntryKind.VERDICT, Role.VERIFIER)
        assert json.loads(recorded.content)["finding_ref"] == n

    # Two sources that disagree: the finding's own page and the page its verifier quoted.
    assert verification.contradictions == (
        Contradiction(
            finding_sequence_no=CONTRADICTED,
            claim=OPENED_1887,
            finding_url=research.pages["rumour"],
            finding_excerpt=RUMOUR_QUOTE,
            contradicting_url=research.pages["opening"],
            contradicting_excerpt=OPENING_QUOTE,
            rationale=CONTRADICTED_WHY,
            verdict_sequence_no=checks[CONTRADICTED].verdict_sequence_no,
            contradicting_finding_sequence_nos=(SUPPORTED,),
        ),
    )
    assert research.progress[0] == "verifying 4 findings"
    assert set(research.progress[1:]) == {
        f"finding {CONTRADICTED}: contradicted",
        f"finding {FAILING}: unverified",
        f"finding {OVERSTATED}: unsupported",
        f"finding {SUPPORTED}: supported",
    }
    # The verifiers' tokens are the run's, counted as verification.
    usage = research.account.usage()
    # Two calls per verifier that answered, and the failing one's refused call.
    assert usage.verification.model_calls == 7 and usage.verification == usage.workers

    # The report: the supported finding and the contradicted one (both sides of one disagreement) are numbered
    # sources; the unsupported and the unverified ones have no number.
    research.script.add(
        REPORT,
        Reply(
            content="It is the tallest structure in the world [3]. A guide says it opened in 1887 [1], but the "
            "opening page says May 1889 [2]."
        ),
    )
    report, _ = await write_report(
        research.writer, QUESTION, research.entries, ResearchEnd(), research.publisher.content, verification
    )

    assert [(c.number, c.url, c.sequence_no, c.judgement) for c in report.citations] == [
        (1, research.pages["rumour"], CONTRADICTED, ClaimJudgement.CONTRADICTED),
        (2, research.pages["opening"], SUPPORTED, ClaimJudgement.SUPPORTED),
    ]  # each citation says how it was verified
    assert report.markdown == (
        "It is the tallest structure in the world . A guide says it opened in 1887 [1], but the opening page says "
        "May 1889 [2]."
    )
    # The number that names no citable finding was cut, and where is kept for the review's citation check.
    assert report.removed_citations == 1
    assert report.invalid_markers == (len("It is the tallest structure in the world "),)

    system_prompt, asked = (m["content"] for m in research.script.requests[REPORT][0]["messages"])
    assert VERIFIED_INSTRUCTIONS in system_prompt
    findings = asked.split("Verified findings:\n", 1)[1].split("\n\n", 1)[0]
    assert findings == (
        f"- (finding {CONTRADICTED}, contradicted, contested by finding {SUPPORTED}) {OPENED_1887} [1]\n"
        f"- (finding {SUPPORTED}, supported, contested by finding {CONTRADICTED}) {OPENED_1889} [2]"
    )
    assert "[3]" not in asked and TALLEST not in asked and WORKERS not in asked
    # The disagreement is spelled out, to be reported as one, citing both sides.
    disagreement = asked.split("Where sources disagree", 1)[1]
    assert "never as fact" in disagreement and "citing both" in disagreement and OPENED_1887 in disagreement
    assert f'{research.pages["rumour"]} says: "{RUMOUR_QUOTE}"' in disagreement
    assert f'but {research.pages["opening"]} says: "{OPENING_QUOTE}"' in disagreement


async def test_a_verifier_sees_its_contract_and_never_the_supervisors_notes_or_other_verdicts(
    research: Research,
) -> None:
    # It reads its inputs once the other verifiers have recorded their verdicts, so a leak would show.
    others_judged = asyncio.Event()
    script_verifiers(research, hold=others_judged)
    verifying = asyncio.create_task(research.verify())
    async with asyncio.timeout(20):
        verdicts = [entry async for entry in verdicts_recorded(research.plane, 2)]
        others_judged.set()
        await verifying
    assert {json.loads(entry.content)["finding_ref"] for entry in verdicts} == {OVERSTATED, CONTRADICTED}
    pages = research.pages
    requests = research.script.requests[f"Verify finding {SUPPORTED}"]
    assert len(requests) == 2

    task = next(m["content"] for m in requests[0]["messages"] if m["role"] == "user")
    assert task.startswith(f"Task: Verify finding {SUPPORTED}\n\nResearch question: {QUESTION}\n\n")
    assert f"Finding {SUPPORTED} is scratchpad entry {SUPPORTED}. It cites: {pages['opening']}." in task
    assert "Criteria:\n" + "\n".join(f"- {criterion}" for criterion in CRITERIA) in task
    # Its own finding and page first, then the pages of the run's other findings, in scratchpad order.
    inputs = [SUPPORTED, pages["opening"], pages["height"], pages["rumour"], pages["workers"]]
    assert task.endswith("Inputs:\n" + "\n".join(f"- {ref}" for ref in inputs))

    # What it read of the scratchpad is its own finding, only.
    shown = research.script.tool_results(f"Verify finding {SUPPORTED}")[0]
    assert f"[{SUPPORTED}] finding" in shown and OPENED_1889 in shown
    assert all(f"[{n}]" not in shown for n in range(1, 12) if n != SUPPORTED)
    # The other verifiers' verdicts were on the thread when it read; none of them, nor the notes, reached it.
    seen = json.dumps([request["messages"] for request in requests])
    for hidden in (NOTES, UNSUPPORTED_WHY, CONTRADICTED_WHY, TALLEST, OPENED_1887, WORKERS):
        assert hidden not in seen, hidden


# -- without a worker: the contract's bounds and the folding of what comes back -------------------------


def finding(n: int, *urls: str) -> Entry:
    sources = tuple(Source(url, "", f"quote {n}") for url in urls)
    return Entry(
        RUN_ID, n, EntryKind.FINDING, Principal("r", Role.RESEARCHER), f"claim {n}", sources, datetime.now(UTC)
    )


async def test_support_whose_quote_lacks_the_claims_date_needs_a_second_verifier_who_agrees(research: Research) -> None:
    """The quote is real and on the finding's page, but it lacks the year the claim states: flagged, and a
    second blind verifier, who finds the year missing, leaves the finding uncitable."""
    pages, script = research.pages, research.script
    partial = "The tower opened to the public in May"
    script_verifiers(research)
    script.scripts[f"Verify finding {SUPPORTED}"].clear()
    script.add(
        f"Verify finding {SUPPORTED}",
        reads(pages["opening"]),
        Reply(calls=(verdict(SUPPORTED, "supported", pages["opening"], partial, "The page gives the opening."),)),
        reads(pages["opening"]),  # the second verifier
        Reply(calls=(verdict(SUPPORTED, "unsupported", pages["opening"], partial, "No year on the page."),)),
    )

    verification = await research.verify()

    [check] = [c for c in verification.findings if c.finding_sequence_no == SUPPORTED]
    assert check.judgement is None and not check.citable
    assert check.rationale.startswith("not verified: the verifier's quote lacks 1889, and a second verifier did")
    assert SUPPORTED not in verification.citable_findings()
    assert f"finding {SUPPORTED}: its verifier's quote lacks 1889" in research.progress
    assert len(script.requests[f"Verify finding {SUPPORTED}"]) == 4  # two verifiers, two calls each


def test_a_flagged_verdict_stands_only_when_the_second_verifier_finds_the_finding_citable() -> None:
    assert missing_specifics("It opened in May 1889, at 330 m.", "It opened in may 1889") == ["330"]
    assert missing_specifics("It cost 7,799,401 francs.", "it cost 7799401 francs") == []
    assert missing_specifics("The Eiffel Tower opened.", "The tower opened.") == []  # names are not checked
    first = FindingCheck(5, "It opened in 1889.", ClaimJudgement.SUPPORTED, quote_excerpt="It opened.")
    assert agreed(first, replace(first, judgement=ClaimJudgement.PARTIALLY_SUPPORTED), ["1889"]) is first
    refused = agreed(first, replace(first, judgement=ClaimJudgement.UNSUPPORTED, rationale="no year"), ["1889"])
    assert refused.judgement is None and not refused.citable
    assert (
        refused.rationale
        == "not verified: the verifier's quote lacks 1889, and a second verifier did not agree (no year)"
    )


def test_a_contract_names_its_own_pages_first_and_at_most_twenty_refs() -> None:
    own = finding(40, "https://a.example/1", "https://a.example/2")
    others = [finding(n, f"https://b.example/{n}", "https://a.example/1") for n in range(2, 30)]
    contract = verifier_contract(QUESTION, own, others)
    assert contract.role is Role.VERIFIER and contract.objective.splitlines()[0] == "Verify finding 40"
    assert len(contract.input_refs) == MAX_INPUT_REFS
    assert contract.input_refs[:4] == ("40", "https://a.example/1", "https://a.example/2", "https://b.example/2")
    assert len(set(contract.input_refs)) == MAX_INPUT_REFS


def test_a_finding_no_verifier_could_take_stays_unverified() -> None:
    spent, _ = fold_verdict(finding(7, "https://a.example/"), None)
    assert spent.judgement is None and not spent.citable and "token budget was spent" in spent.rationale
    refused = DelegationResult("d", error_code=DelegationErrorCode.OUTPUT_INVALID)
    failed, contradiction = fold_verdict(finding(7, "https://a.example/"), refused)
    assert (failed.judgement, contradiction) == (None, None)


def test_support_quoted_from_another_findings_page_leaves_the_finding_unverified() -> None:
    """The report would cite the finding's own page: support read elsewhere does not confirm it."""
    own = finding(7, "https://a.example/own")

    def supported_on(url: str) -> DelegationResult:
        verdict = ClaimVerdict(
            finding_ref=7,
            judgement=ClaimJudgement.SUPPORTED,
            quote=VerifiedQuote(url=url, excerpt="the words"),
            rationale="it says so",
        )
        return DelegationResult(
            "d", output_kind="claim_verdict", output_json=verdict.model_dump_json(), output_sequence_no=9
        )

    elsewhere, _ = fold_verdict(own, supported_on("https://b.example/other"))
    assert (
        elsewhere.judgement is None
        and not elsewhere.citable
        and "not from a page this finding cites" in elsewhere.rationale
    )
    on_its_page, _ = fold_verdict(own, supported_on("https://a.example/own"))
    assert on_its_page.judgement is ClaimJudgement.SUPPORTED and on_its_page.citable


def test_only_citable_findings_are_numbered_and_shown_and_a_run_without_verification_is_unchanged() -> None:
    entries = [finding(2, "https://a.example/"), finding(3, "https://b.example/")]
    plain = synthesis_messages(QUESTION, entries, verified_sources(entries), "notes")
    assert "claim 2" in plain[1].content and "claim 3" in plain[1].content
    # A Verification that is not enabled changes nothing.
    assert (
        synthesis_messages(QUESTION, entries, verified_sources(entries, Verification()), "notes", Verification())
        == plain
    )

    judged = Verification(
        enabled=True,
        findings=(
            FindingCheck(2, "claim 2", ClaimJudgement.UNSUPPORTED),
            FindingCheck(3, "claim 3", ClaimJudgement.PARTIALLY_SUPPORTED),
        ),
    )
    sources = verified_sources(entries, judged)
    assert [(c.number, c.sequence_no) for c in sources] == [(1, 3)]
    asked = synthesis_messages(QUESTION, entries, sources, "notes", judged)[1].content
    assert "claim 2" not in asked and "- (finding 3, partially supported) claim 3 [1]" in asked


async def test_verification_taken_up_by_another_process_replays_the_recorded_verdicts_and_asks_no_model(
    research: Research,
) -> None:
    """A supervisor that stopped after its claim-verifiers ended: the one that takes the run up orders them
    again under the ids its ledger recorded, and the worker replays each result; no verifier runs twice."""
    script_verifiers(research)
    first = await research.verify()
    asked = sum(len(requests) for requests in research.script.requests.values())
    prior = PriorDelegations.from_ledger(RUN_ID, await research.thread())
    assert len(prior.ordered) == 4 and {o.role for o in prior.ordered.values()} == {Role.VERIFIER}
    account = RunAccount()
    workers, verification_usage = prior.usage()
    account.carry(Usage(), workers, verification_usage)
    taken_up = Delegator(
        run_id=RUN_ID,
        thread_id=RUN_ID,
        max_worker_turns=0,
        parallel=4,
        deadline=time.monotonic() + 60,
        client=research.client,
        scratchpad=research.plane,
        account=account,
        budget=TokenBudget(0, account),
        publisher=research.publisher,
        ledger=RunLedger(research.plane, RUN_ID, RUN_ID),
        earlier=EarlierOrders(prior.ids_to_reuse(()), prior.used.keys(), prior.last_number),
    )

    async def progress(message: str) -> None:
        research.progress.append(message)

    again = await verify_claims(
        QUESTION, research.entries, taken_up, RunLedger(research.plane, RUN_ID, RUN_ID), progress
    )
    assert sum(len(requests) for requests in research.script.requests.values()) == asked, "no verifier ran again"
    assert [(c.finding_sequence_no, c.judgement) for c in again.findings] == [
        (c.finding_sequence_no, c.judgement) for c in first.findings
    ]
    # The usage came with the ledger once, not a second time with the replayed results (the ledger records
    # tokens and model calls; tool calls it does not).
    before, after = research.account.usage().workers, account.usage().workers
    assert (after.input_tokens, after.output_tokens, after.model_calls) == (
        before.input_tokens,
        before.output_tokens,
        before.model_calls,
    )
    assert after.tokens > 0
    thread = await research.thread()
    assert sum(entry.kind is EntryKind.VERDICT for entry in thread) == 3, "no verdict recorded twice"


WIND_TITLE = "Wind Load on Wrought-Iron Lattice Towers"
WIND_CLAIM = "Open lattices shed most of the wind load on wrought-iron towers."
WIND_QUOTE = "open lattices shed most of the wind load"
MADE_UP_TITLE = "Lattice Towers of Unbounded Height"
MADE_UP_CLAIM = "A wrought-iron lattice tower can be built to any height."
MADE_UP_QUOTE = "can be built to any height"
# The paper as the arXiv fake lists it (tests/fakes/literature_server.py).
WIND = {
    "url": "http://arxiv.org/abs/1901.00001v2",
    "title": WIND_TITLE,
    "authors": ["Ada Girder", "Ben Rivet", "Cleo Truss", "Dan Strut", "Eve Gusset", "Finn Purlin", "Gail Spandrel"],
    "year": 2019,
}


def paper_page(title: str, text: str) -> str:
    return (
        f"<!doctype html><html><head><title>{title}</title></head><body><article><p>{text}</p></article></body></html>"
    )


async def test_a_cited_paper_the_catalogues_do_not_list_as_its_source_names_it_is_never_cited(
    research: Research, site: FixtureWeb
) -> None:
    """Two findings citing papers (their pages' host is a paper host here): the real paper's bibliographic
    verifier finds it; the made-up one's claims the real paper's record, which the code refuses, so the
    finding stays unverified however supported its claim-verifier found it, and the ledger says why."""
    wind = site.add("/wind.html", paper_page(WIND_TITLE, f"We find that {WIND_QUOTE}."))
    made_up = site.add("/made-up.html", paper_page(MADE_UP_TITLE, f"Such a tower {MADE_UP_QUOTE}."))
    papers = []
    for n, (claim, url, title, quote) in enumerate(
        [(WIND_CLAIM, wind, WIND_TITLE, WIND_QUOTE), (MADE_UP_CLAIM, made_up, MADE_UP_TITLE, MADE_UP_QUOTE)]
    ):
        appended = await research.plane.append(
            RUN_ID,
            kind=EntryKind.FINDING,
            author=Principal(f"scholar-{n}", Role.RESEARCHER),
            content=claim,
            sources=(Source(url, title, quote),),
            request_id=f"paper-{n}",
        )
        papers.append(appended.entry)
    real, fake = (paper.sequence_no for paper in papers)
    script = research.script
    for finding, url, quote in ((real, wind, WIND_QUOTE), (fake, made_up, MADE_UP_QUOTE)):
        script.add(
            f"Verify finding {finding}",
            reads(url),
            Reply(calls=(verdict(finding, "supported", url, quote, "the page says it"),)),
        )
        submitted = {
            "finding_ref": finding,
            "cited_url": url,
            "judgement": "verified",
            "record": WIND,  # the made-up paper's verifier passes the real paper's record off as its own
            "rationale": "arXiv lists it",
        }
        script.add(
            f"Verify the paper finding {finding} cites",
            Reply(calls=(Call("look_up_paper", {"query": "lattice towers"}, "look"),)),
            Reply(calls=(Call("submit_bibliographic_verdict", submitted, "submit"),)),
        )

    async def progress(message: str) -> None:
        research.progress.append(message)

    ledger = RunLedger(research.plane, RUN_ID, RUN_ID)
    verification = await verify_claims(
        QUESTION, papers, research.delegator, ledger, progress, paper_hosts={"127.0.0.1"}
    )

    checks = {check.finding_sequence_no: check for check in verification.findings}
    assert checks[real].judgement is ClaimJudgement.SUPPORTED and checks[real].citable
    assert checks[fake].judgement is None and not checks[fake].citable
    assert checks[fake].rationale == (
        f"not verified: the catalogue's title of {made_up} ({WIND_TITLE!r}) is not the one its source gives "
        f"({MADE_UP_TITLE!r})"
    )
    # The ledger: both bibliographic verdicts as their verifiers recorded them, and the supervisor's refusal of
    # the made-up paper's finding, naming the claim verdict it does not let stand.
    thread = await research.thread()
    bibliographic = [parse_record(e.kind, e.content) for e in thread if e.kind is EntryKind.BIBLIOGRAPHIC_VERDICT]
    assert {(b.finding_ref, b.judgement) for b in bibliographic if isinstance(b, BibliographicVerdict)} == {
        (real, BibliographicJudgement.VERIFIED),
        (fake, BibliographicJudgement.VERIFIED),
    }
    assert all(
        e.author.role is Role.BIBLIOGRAPHIC_VERIFIER for e in thread if e.kind is EntryKind.BIBLIOGRAPHIC_VERDICT
    )
    [refusal] = [parse_record(e.kind, e.content) for e in thread if e.kind is EntryKind.REFUSAL]
    assert (
        isinstance(refusal, ClaimRefusal) and refusal.finding_ref == fake and refusal.reason == checks[fake].rationale
    )
    claimed = {
        parse_record(e.kind, e.content).finding_ref: e.sequence_no for e in thread if e.kind is EntryKind.VERDICT
    }  # type: ignore[attr-defined]
    assert refusal.verdict_ref == claimed[fake]
    # What any reader folds from the ledger agrees (the fold reads the whole thread: these two findings' checks).
    folded = {check.finding_sequence_no: check for check in fold_ledger(thread).findings}
    assert (folded[real], folded[fake]) == (checks[real], checks[fake])


async def test_a_paper_no_catalogue_lists_is_not_found_and_its_finding_stays_unverified(
    research: Research, site: FixtureWeb
) -> None:
    made_up = site.add("/made-up.html", paper_page(MADE_UP_TITLE, f"Such a tower {MADE_UP_QUOTE}."))
    appended = await research.plane.append(
        RUN_ID,
        kind=EntryKind.FINDING,
        author=Principal("scholar", Role.RESEARCHER),
        content=MADE_UP_CLAIM,
        sources=(Source(made_up, MADE_UP_TITLE, MADE_UP_QUOTE),),
        request_id="paper",
    )
    finding = appended.entry.sequence_no
    research.script.add(
        f"Verify finding {finding}",
        reads(made_up),
        Reply(calls=(verdict(finding, "supported", made_up, MADE_UP_QUOTE, "the page says it"),)),
    )
    research.script.add(
        f"Verify the paper finding {finding} cites",
        Reply(calls=(Call("look_up_paper", {"query": MADE_UP_TITLE}, "look"),)),
        Reply(
            calls=(
                Call(
                    "submit_bibliographic_verdict",
                    {"finding_ref": finding, "cited_url": made_up, "judgement": "not_found", "rationale": "no match"},
                    "submit",
                ),
            )
        ),
    )

    async def progress(message: str) -> None:
        research.progress.append(message)

    ledger = RunLedger(research.plane, RUN_ID, RUN_ID)
    verification = await verify_claims(
        QUESTION, [appended.entry], research.delegator, ledger, progress, paper_hosts={"127.0.0.1"}
    )
    [check] = verification.findings
    assert check.judgement is None and check.rationale == f"not verified: its paper {made_up} is not found (no match)"
