"""Bibliographic verification: a finding that cites a paper is citable only once a blind bibliographic
verifier has found that paper in the literature catalogues, as its source names it.

A source is a paper when its URL's host is one of the run's paper hosts (arXiv, DOI, Semantic Scholar and
the like; a setting). Each such source gets its own verifier, beside the finding's claim-verifier. Its
BibliographicVerdict (checked by the worker's gate against what its look-ups listed) stands only when it
judges the paper verified, for the source the contract named, and the catalogue's title is the one the
source gives: anything else (mismatch, not found, a failed verifier, a spent budget) leaves the finding
unverified, and so never cited.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit

from quarry.identity import Role
from quarry.records.base import RecordError
from quarry.records.research import BibliographicJudgement, BibliographicVerdict
from quarry.vocabulary import DelegationResult, Entry, Source
from supervisor_svc.runs.delegating import Contract

# Papers checked per finding, at most (each is a delegation).
MAX_PAPERS_PER_FINDING = 3
_MAX_QUESTION_CHARS = 12_000

CRITERIA = (
    "Judge only from what look_up_paper lists, never from what you know or expect.",
    "verified: a catalogue lists the paper with the title the source gives (and its authors and year); mismatch: "
    "what is listed there is another paper; not_found: no catalogue lists it.",
    "Copy the catalogue's record (url, title, authors, year) exactly as look_up_paper listed it.",
)


def paper_sources(finding: Entry, paper_hosts: Collection[str]) -> list[Source]:
    """The finding's quoted sources that are papers (their host is a paper host), each URL once."""
    papers: dict[str, Source] = {}
    for source in finding.sources:
        host = (urlsplit(source.url).hostname or "").lower()
        if source.excerpt and host in paper_hosts and source.url not in papers:
            papers[source.url] = source
    return list(papers.values())[:MAX_PAPERS_PER_FINDING]


def bibliographic_contract(question: str, finding: Entry, paper: Source) -> Contract:
    n = finding.sequence_no
    named = f', which its source calls "{paper.title}"' if paper.title.strip() else ""
    objective = (
        f"Verify the paper finding {n} cites\n\n"
        f"Research question: {question[:_MAX_QUESTION_CHARS]}\n\n"
        f"Finding {n} is scratchpad entry {n}. It cites {paper.url}{named}.\n"
        "Look the paper up in the literature catalogues and submit your bibliographic verdict on it, with "
        f"finding_ref {n} and cited_url {paper.url}."
    )
    return Contract(Role.BIBLIOGRAPHIC_VERIFIER, objective, CRITERIA, (str(n), paper.url))


def paper_refusal(paper: Source, result: DelegationResult | None) -> str:
    """Why the paper does not stand ("" when its verifier verified it, as the source names it)."""
    if result is None:
        return f"not verified: the token budget was spent before {paper.url} could be checked in the catalogues"
    if not result.succeeded or not result.output_sequence_no:
        failed = result.error_code.value if result.error_code is not None else "no verdict"
        return f"not verified: the bibliographic verifier of {paper.url} failed ({failed})"
    try:
        verdict = BibliographicVerdict.parse(result.output_json)
    except RecordError as error:
        return f"not verified: the bibliographic verdict on {paper.url} is no verdict: {error}"
    assert isinstance(verdict, BibliographicVerdict)
    if verdict.cited_url != paper.url:
        return f"not verified: the bibliographic verifier judged {verdict.cited_url}, not {paper.url}"
    if verdict.judgement is not BibliographicJudgement.VERIFIED or verdict.record is None:
        return (
            f"not verified: its paper {paper.url} is {verdict.judgement.value.replace('_', ' ')} ({verdict.rationale})"
        )
    if paper.title.strip() and _plain(verdict.record.title) not in _plain(paper.title):
        return (
            f"not verified: the catalogue's title of {paper.url} ({verdict.record.title!r}) is not the one its "
            f"source gives ({paper.title!r})"
        )
    return ""


def _plain(text: str) -> str:
    return " ".join(text.split()).casefold()
