"""Claim verification: every finding the report may cite is judged by its own blind claim-verifier.

Each verifier gets a contract, never the run: the question, the finding's number, the page(s) the finding
cites, and as further inputs the pages the run's other findings cite, so that it can find a source that
says otherwise. It re-reads the pages itself and returns a ClaimVerdict, which the worker checked and
recorded before the result comes back. The supervisor's notes and other verifiers' verdicts are never
among its inputs. All verifiers run at once; the Delegator bounds how many run and shares the budget.

A supported verdict whose quote lacks the claim's numbers or dates (`missing_specifics`) is flagged: a
second blind verifier must find the finding citable too, or it stays unverified.

What comes back is a Verification holding one FindingCheck per finding and a Contradiction per finding a
source contradicts, with the findings on the other side (those quoting that source). Supported or
partially supported findings are citable afterwards, and both sides of a contradiction are, contested:
only in a sentence that presents the disagreement. A finding whose verifier failed, or that no verifier
could take before the budget was spent, stays unverified and is not citable.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Collection, Sequence

from quarry.identity import Role
from quarry.records.base import RecordError
from quarry.records.fold import (
    MAX_VERIFIED_FINDINGS,
    both_sides,
    check_of,
    contradiction_of,
    unverified,
    verified_findings,
)
from quarry.records.research import ClaimRefusal, ClaimVerdict
from quarry.records.verification import CITABLE, Contradiction, FindingCheck, Verification
from quarry.vocabulary import DelegationResult, Entry
from supervisor_svc.runs.delegating import Contract, Delegator
from supervisor_svc.runs.ledger import RunLedger
from supervisor_svc.verification.bibliography import bibliographic_contract, paper_refusal, paper_sources

# Told what verification is doing, in a line (e.g. publishing it as a status event).
Progress = Callable[[str], Awaitable[None]]

# The most of a refusal's reason the ledger keeps (a record's text bound).
MAX_REFUSAL_CHARS = 4000
# A contract's input refs, at most (the worker refuses more).
MAX_INPUT_REFS = 20
# The worker bounds a ref's length; a longer URL could not be a ref, so it is left out.
_MAX_REF_CHARS = 2048
# The question's share of the objective (the worker refuses objectives over 16,000 characters).
_MAX_QUESTION_CHARS = 12_000

CRITERIA = (
    "Judge only from what the pages among your inputs say, never from what you know or expect.",
    "Read the finding first, then re-read the page(s) it cites yourself.",
    "supported: the page says everything the finding claims; partially_supported: it says less, or only "
    "part of it; unsupported: it does not say it; contradicted: a page among your inputs says otherwise.",
    "Quote the passage your judgement rests on exactly, word for word, as it appears on the page you read.",
    "The other pages among your inputs are sources of other findings of this research: read them when they "
    "may bear on the claim, and judge contradicted, quoting that page, when one of them says otherwise.",
)


def verifier_contract(question: str, finding: Entry, others: Sequence[Entry]) -> Contract:
    """The blind contract for one finding: its number, the question, its pages, and the run's other pages."""
    n = finding.sequence_no
    own = _urls([finding])
    other = [url for url in _urls(others) if url not in own]
    objective = (
        f"Verify finding {n}\n\n"
        f"Research question: {question[:_MAX_QUESTION_CHARS]}\n\n"
        f"Finding {n} is scratchpad entry {n}. It cites: {', '.join(own)}.\n"
        "Judge whether the page(s) it cites say what the finding claims, and submit your verdict on it."
    )
    refs = (str(n), *own, *other)[:MAX_INPUT_REFS]
    return Contract(Role.VERIFIER, objective, CRITERIA, refs)


async def verify_claims(
    question: str,
    entries: Sequence[Entry],
    delegator: Delegator,
    ledger: RunLedger,
    progress: Progress,
    paper_hosts: Collection[str] = (),
) -> Verification:
    """One blind claim-verifier per finding the report may cite, all at once; their verdicts folded. Beside it,
    a blind bibliographic verifier per paper the finding cites (a source on one of `paper_hosts`): a paper it
    does not verify leaves the finding unverified (bibliography.py).

    `entries` are the run's scratchpad entries; `ledger` gets a ClaimRefusal for each finding left unverified;
    `progress` is told when verification starts and as each finding's verdict comes in. What comes back is
    what `quarry.records.fold.fold_ledger` makes of the ledger then."""
    findings, beyond = verified_findings(entries)
    if not findings:
        return Verification(enabled=True)
    await progress(f"verifying {len(findings)} finding{'s' if len(findings) != 1 else ''}")

    async def judge(finding: Entry) -> tuple[FindingCheck, Contradiction | None, DelegationResult | None]:
        others = [other for other in findings if other is not finding]
        contract = verifier_contract(question, finding, others)
        result = await delegator.assign(contract, f"verify-{finding.sequence_no}", sharing=len(findings))
        check, contradiction = fold_verdict(finding, result)
        missing = missing_specifics(finding.content, check.quote_excerpt) if check.citable else []
        if missing:  # support whose quote lacks the claim's specifics: a second, blind verifier must agree
            await progress(f"finding {finding.sequence_no}: its verifier's quote lacks {', '.join(missing)}")
            second = await delegator.assign(contract, f"verify-{finding.sequence_no}-second", sharing=len(findings))
            check = agreed(check, fold_verdict(finding, second)[0], missing)
        return check, contradiction, result

    async def check_papers(finding: Entry) -> str:
        """Why a paper the finding cites does not stand ("" when each does, or it cites none)."""
        papers = paper_sources(finding, paper_hosts)
        results = await asyncio.gather(
            *(
                delegator.assign(
                    bibliographic_contract(question, finding, paper),
                    f"cite-{finding.sequence_no}-{index}",
                    sharing=len(findings),
                )
                for index, paper in enumerate(papers)
            )
        )
        return next(
            (why for paper, result in zip(papers, results, strict=True) if (why := paper_refusal(paper, result))), ""
        )

    async def verify(finding: Entry) -> tuple[FindingCheck, Contradiction | None]:
        (check, contradiction, result), paper_problem = await asyncio.gather(judge(finding), check_papers(finding))
        if paper_problem:  # a paper that does not stand is never cited, whatever its claim-verifier said
            check, contradiction = unverified(finding, paper_problem), None
        if check.judgement is None:
            await refuse(ledger, check, _recorded_verdict(result))
        await progress(f"finding {finding.sequence_no}: {_judged(check)}")
        return check, contradiction

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(verify(finding)) for finding in findings]
    folded = [task.result() for task in tasks]
    why = f"not verified: only the first {MAX_VERIFIED_FINDINGS} findings of a run are verified"
    for finding in beyond:
        check = unverified(finding, why)
        await refuse(ledger, check, None)
        folded.append((check, None))
    contradictions = [contradiction for _, contradiction in folded if contradiction is not None]
    return Verification(
        enabled=True,
        findings=tuple(check for check, _ in folded),
        contradictions=tuple(both_sides(contradiction, findings) for contradiction in contradictions),
    )


async def refuse(ledger: RunLedger, check: FindingCheck, verdict: int | None) -> None:
    """Put on the ledger that the finding stays unverified, and why (`verdict`: the verdict entry refused). A
    refusal that cannot be written fails the run (LedgerUnwritable): without it the ledger would fold to a
    verified finding."""
    finding = check.finding_sequence_no
    reason = (check.rationale or "not verified")[:MAX_REFUSAL_CHARS]
    await ledger.require(
        lambda: ClaimRefusal(finding_ref=finding, verdict_ref=verdict, reason=reason),
        f"refusal/{finding}",
        f"the refusal of finding {finding}",
    )


def _recorded_verdict(result: DelegationResult | None) -> int | None:
    """The verdict entry a verifier recorded, if it recorded one."""
    if result is None or not result.succeeded or not result.output_sequence_no:
        return None
    return result.output_sequence_no


# A number (digits, with separators and decimals), or a month's name: a date's parts.
_SPECIFIC = re.compile(
    r"\d[\d,.]*\d|\d|\b(?:January|February|March|April|May|June|July|August|September|October|November|December)\b"
)


def missing_specifics(claim: str, quote: str) -> list[str]:
    """The claim's numbers and dates (a month's name, a year) that the quote does not contain, as written
    (case, spacing and thousands separators aside). Proper names are not checked: a page names its subject
    once and then says "the tower", so a quote without the name is no sign of a claim it does not bear."""
    said = " ".join(quote.replace(",", "").split()).casefold()
    found: list[str] = []
    for match in _SPECIFIC.finditer(claim):
        word = match.group().rstrip(".,").replace(",", "")
        if word and word.casefold() not in said and word not in found:
            found.append(word)
    return found


def agreed(first: FindingCheck, second: FindingCheck, missing: Sequence[str]) -> FindingCheck:
    """A flagged supported verdict stands only when a second verifier finds the finding citable too."""
    if second.citable:
        return first
    why = (
        f"not verified: the verifier's quote lacks {', '.join(missing)}, and a second verifier did not "
        f"agree ({second.rationale or 'it judged it ' + (second.judgement.value if second.judgement else 'not')})"
    )
    return FindingCheck(first.finding_sequence_no, first.claim, None, rationale=why)


def fold_verdict(finding: Entry, result: DelegationResult | None) -> tuple[FindingCheck, Contradiction | None]:
    """A verifier's result as the finding's check, and the disagreement between sources it found, if any."""
    if result is None or not result.succeeded:
        return unverified(finding, _why_unverified(result)), None
    try:
        verdict = ClaimVerdict.parse(result.output_json)
    except RecordError as error:  # the worker checked it; a result that is no verdict judges nothing
        return unverified(finding, f"not verified: {error}"), None
    assert isinstance(verdict, ClaimVerdict)
    own_urls = {source.url for source in finding.sources}
    if verdict.judgement in CITABLE and (verdict.quote is None or verdict.quote.url not in own_urls):
        # Support read on another finding's page does not confirm the source this finding would be cited by.
        why = "not verified: the verifier's supporting quote is not from a page this finding cites"
        return unverified(finding, why), None
    number = result.output_sequence_no
    return check_of(finding, number, verdict), contradiction_of(finding, number, verdict)


def _urls(findings: Sequence[Entry]) -> list[str]:
    """The pages the findings quote, each once, in scratchpad order."""
    urls = (source.url for finding in findings for source in finding.sources if source.excerpt)
    return [url for url in dict.fromkeys(urls) if len(url) <= _MAX_REF_CHARS]


def _why_unverified(result: DelegationResult | None) -> str:
    if result is None:
        return "not verified: the run's token budget was spent before a verifier could start"
    if result.error_code is not None:
        return f"not verified: the verifier failed ({result.error_code.value})"
    return ""


def _judged(check: FindingCheck) -> str:
    return check.judgement.value.replace("_", " ") if check.judgement else "unverified"
