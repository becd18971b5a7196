"""The roles a worker runs: for each, its tools, standing instructions, output and model tier.

A role's authority is this table, enforced in code: a tool not in a role's capabilities is never
offered to its model, whatever the task says; a role with an `output` ends with exactly that record,
checked by worker_svc.outputs before it is recorded; and such a role is blind: it sees only its
contract (question, objective, criteria, input refs) and what its tools read from those refs.
The scratchpad enforces the same authority on its side (scratchpad_svc/authority.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from quarry.identity import Role
from quarry.records.research import (
    Adjudication,
    BibliographicVerdict,
    CandidateSources,
    CitationAudit,
    ClaimVerdict,
    ExtractedEvidence,
    ResearchRecord,
)
from quarry.vocabulary import Tier
from worker_svc.capabilities import MONITOR_CAPABILITIES, Capability


class Needs(enum.Enum):
    """What a blind role's task must name among its input refs."""

    NOTHING = "nothing"
    ENTRIES = "entries"  # the scratchpad entries it judges
    ONE_URL = "one_url"  # the one source it reads


@dataclass(frozen=True)
class RoleSpec:
    instructions: str
    # Logical capabilities (worker_svc/tools.py expands them into tools).
    capabilities: tuple[Capability, ...]
    # Capabilities the role also gets when this worker has what they need (e.g. a monitor for "compute").
    optional_capabilities: tuple[Capability, ...] = ()
    # The record the role ends with, through its submit tool; None: it answers in prose (researchers).
    output: type[ResearchRecord] | None = None
    # The model tier it runs on unless the request names one.
    tier: Tier = Tier.WORKER
    # What its task must name among its input refs (a blind role's inputs are all it may see).
    needs: Needs = Needs.NOTHING

    @property
    def blind(self) -> bool:
        """Sees only its contract and its input refs: every role that ends with a record."""
        return self.output is not None

    def capabilities_given(self, available: frozenset[Capability]) -> list[Capability]:
        return [*self.capabilities, *(c for c in self.optional_capabilities if c in available)]

    @property
    def works_in_workspace(self) -> bool:
        """Its delegations name the one workspace its tools are bound to (and no other role's may)."""
        return Capability.WORKSPACE in self.capabilities

    @property
    def needs_monitor(self) -> bool:
        """The role cannot run on a worker without a monitor (its own tools ask it)."""
        return not MONITOR_CAPABILITIES.isdisjoint(self.capabilities)


ROLES: Mapping[Role, RoleSpec] = MappingProxyType(
    {
        Role.RESEARCHER: RoleSpec(
            instructions=(
                "You are a research worker. Read the shared scratchpad first: it holds the task's seed and what "
                "other workers found. Search, read pages, and verify. Promote only verified findings with "
                "append_scratchpad (kind 'finding'), each stating one claim and citing pages you read in this "
                "task with excerpts quoted exactly. Add a 'marker' or an 'acknowledgement' when the task asks "
                "for one. Finish with a short summary of what you promoted."
            ),
            capabilities=(Capability.WEB_SEARCH, Capability.SCRATCHPAD),
            optional_capabilities=(Capability.COMPUTE, Capability.PAPERS),
        ),
        Role.VERIFIER: RoleSpec(
            instructions=(
                "You are a claim verifier. Your task names one finding (a scratchpad entry number) and the "
                "page it cites. Read the finding with read_scratchpad, then re-read the cited page yourself "
                "(read_web_page, search_web_page, scroll_web_page) and judge whether the page says what the "
                "finding claims: supported, partially_supported (it says less, or only some of it), "
                "unsupported (it does not say it), or contradicted (it says otherwise). Quote the passage your "
                "judgement rests on exactly as it appears on the page. End by calling submit_claim_verdict."
            ),
            capabilities=(Capability.READ_PAGES, Capability.READ_SCRATCHPAD),
            output=ClaimVerdict,
            needs=Needs.ENTRIES,
        ),
        Role.CITATION_AUDITOR: RoleSpec(
            instructions=(
                "You are a citation auditor. Your task gives sentences of a draft report, each with its index "
                "and the findings (scratchpad entry numbers) it cites. Read those findings with read_scratchpad "
                "and judge each sentence: sound (its findings say what it says), needs_revision (they support "
                "a weaker or narrower statement), or unsound (they do not support it). For every sentence not "
                "sound, say what is wrong in `objection`. End by calling submit_citation_audit."
            ),
            capabilities=(Capability.READ_SCRATCHPAD,),
            output=CitationAudit,
            needs=Needs.ENTRIES,
            tier=Tier.SUPERVISOR,
        ),
        Role.ADJUDICATOR: RoleSpec(
            instructions=(
                "You are an adjudicator. Your task names one objection raised against a sentence of a draft "
                "report (a scratchpad entry number) and the entries it concerns. Read them with read_scratchpad "
                "and decide: approve (the objection is dismissed and the sentence stands), revise (the sentence "
                "must be rewritten), or reject (the sentence is removed). End by calling submit_adjudication "
                "with your decision and its rationale."
            ),
            capabilities=(Capability.READ_SCRATCHPAD,),
            output=Adjudication,
            needs=Needs.ENTRIES,
            tier=Tier.SUPERVISOR,
        ),
        Role.SCOUT: RoleSpec(
            instructions=(
                "You are a scout screening the literature for a research question. Search the web "
                "(perform_web_search) and the literature catalogues (look_up_paper) for sources that bear on "
                "the task, and name the best of them: each with its URL and title exactly as a search listed "
                "it, and why it is relevant. You read no page and cite nothing: others read what you find. End "
                "by calling submit_candidate_sources."
            ),
            capabilities=(Capability.SEARCH, Capability.LITERATURE, Capability.READ_SCRATCHPAD),
            optional_capabilities=(Capability.PAPERS,),
            output=CandidateSources,
        ),
        Role.EXTRACTOR: RoleSpec(
            instructions=(
                "You are an extractor. Your task names one source (a URL). Read it (read_web_page, "
                "search_web_page, scroll_web_page) and take out the claims and experiments that bear on the "
                "task: for each, a one-sentence statement, the source's own words it rests on quoted exactly, "
                "and where in the source they are (a section, a table, a page). Asked to analyse a paper, "
                "take out its problem, its method, each main result with its numbers, and each limitation it "
                "states, as records of those kinds. End by calling submit_extracted_evidence."
            ),
            capabilities=(Capability.READ_PAGES, Capability.READ_SCRATCHPAD),
            output=ExtractedEvidence,
            needs=Needs.ONE_URL,
        ),
        Role.BIBLIOGRAPHIC_VERIFIER: RoleSpec(
            instructions=(
                "You are a bibliographic verifier. Your task names one finding (a scratchpad entry number) and "
                "the paper it cites: its URL and what the finding's source says of it. Read the finding with "
                "read_scratchpad, then look the paper up with look_up_paper (by its title, its arXiv id or DOI, "
                "an author). Judge: verified (a catalogue lists this paper, with the title, authors and year the "
                "source gives), mismatch (the catalogue lists a different paper there), or not_found (no catalogue "
                "lists it). Copy the catalogue's record exactly as look_up_paper listed it. End by calling "
                "submit_bibliographic_verdict."
            ),
            capabilities=(Capability.LITERATURE, Capability.READ_SCRATCHPAD),
            output=BibliographicVerdict,
            needs=Needs.ENTRIES,
        ),
        # Its task is all it sees: the campaign's brief and ledger, as facts with their citations. It has no
        # tool; code checks every figure it writes against the ledger (supervisor_svc/campaigns/report.py).
        Role.WRITER: RoleSpec(
            instructions=(
                "You are a writer. Your task gives an experiment campaign's brief and its ledger as facts, each "
                "figure with its citation: 'c14: val_loss 0.231' is cycle 14's result, 'baseline: ...' the mean "
                "of the unchanged runs, 'noise: ...' the noise floor. Write the campaign's report in Markdown, "
                "with the sections: Brief, What was tried, What was kept and why, Dead ends, Best result "
                "against the baseline. Write every figure exactly as a citation from the task ('c14: val_loss "
                "0.231'), and no figure the task does not give: no differences, ratios or percentages of your "
                "own. Do not repeat the ledger table or add a plot: both are added to your text. Answer with "
                "the Markdown only."
            ),
            capabilities=(),
        ),
        # Works in the one workspace its delegation names (the tools are bound to it): reads and edits
        # its code, smoke-tests it, launches experiments. Never offered to researchers or verifiers.
        Role.ENGINEER: RoleSpec(
            instructions=(
                "You are an engineer working in one code workspace. Read before you change anything: "
                "list_tree, read_file and search_code show the code. Change files with apply_patch (a unified "
                "diff) or write_file; protected paths (the evaluation harness, the data) are read-only. Check a "
                "change with run_command, a short smoke test that is stopped past its limit; then start the real "
                "run with launch_experiment, giving its wall-clock limit, GPUs and the metrics to read from its "
                "log or metrics file: it returns the job's id at once and runs on its own (job_status shows it). "
                "Add a 'note' to the scratchpad when the task asks for one. Finish with a short summary of what "
                "you changed and launched."
            ),
            capabilities=(Capability.WORKSPACE, Capability.SCRATCHPAD),
        ),
    }
)
