"""The report: numbered sources from verified scratchpad findings, and citations checked as they stream.

Sources are numbered from the scratchpad only: each source of a finding (or
verdict) written by a worker, whose excerpt the worker's tools verified
against a page it read before the scratchpad accepted it. The model cites them
as [n]. Its text passes through CitationFilter on the way to the client: a
citation naming no source is cut out there and counted, so what streams and
what is stored are the same report, and no citation in it resolves to nothing.

When the run verifies its claims, only the findings a blind verifier judged supported or partially
supported are numbered and shown to the model: a finding judged unsupported or contradicted, or left
unverified, has no number, so no citation can name it. Contradictions are given to the model as
disagreements between sources, to be reported as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from quarry.agent.messages import Message, system, user
from quarry.agent.model import ModelClient
from quarry.agent.usage import Usage
from quarry.identity import Role
from quarry.records.verification import Contradiction, SentenceStatus, Verification
from quarry.vocabulary import Entry, EntryKind
from supervisor_svc.runs.domain import Citation, Report, RunWarning
from supervisor_svc.runs.publishing import TextStream

# Entries whose sources a worker verified before the scratchpad accepted them: researchers' findings.
# (A claim-verifier's verdict judges a finding; it is not a source of its own.)
_VERIFIED_KINDS = {EntryKind.FINDING}
_WORKER_ROLES = {Role.RESEARCHER}
_EN_DASH = "\u2013"
_MARKER_CHARS = frozenset("0123456789,- \n" + _EN_DASH)
_MAX_MARKER = 200
_OVERFLOW = "[\x00"  # the state of a marker that grew past _MAX_MARKER
_MAX_RANGE = 50

INSTRUCTIONS = (
    "You write the final report of a research run, in Markdown. Use only the verified findings and numbered "
    "sources given to you; cite every claim with the source numbers in square brackets, like [1] or [2, 3]. "
    "Never cite a number that is not in the list. If the findings do not answer the question, say what is "
    "known and what remains open. Do not add a bibliography: the sources are attached to the report."
)
# Added when the run verified its claims.
VERIFIED_INSTRUCTIONS = (
    "An independent verifier re-read the sources of each finding listed; findings it did not support are "
    "left out and cannot be cited. A finding judged partially supported says more than its source: state only "
    "what its quoted source says. Where sources disagree, present it as a disagreement between the sources in "
    "one sentence, saying what each one says and citing both sides; never state either side as fact. A "
    "finding marked contested may be cited only in such a sentence."
)


def _is_finding(entry: Entry) -> bool:
    return entry.kind in _VERIFIED_KINDS and entry.author.role in _WORKER_ROLES


def _verifying(verification: Verification | None) -> Verification | None:
    """The claim checks to honour: None when the run does not verify."""
    return verification if verification is not None and verification.enabled else None


def _shown_findings(entries: Sequence[Entry], verification: Verification | None) -> list[Entry]:
    """The findings the report model sees: all of them, or only the citable ones when the run verifies."""
    checks = _verifying(verification)
    if checks is None:
        return [entry for entry in entries if _is_finding(entry)]
    citable = checks.citable_findings()
    return [entry for entry in entries if _is_finding(entry) and entry.sequence_no in citable]


def verified_sources(entries: Sequence[Entry], verification: Verification | None = None) -> list[Citation]:
    """The citable sources, numbered from 1 in scratchpad order; one number per (url, excerpt).

    With `verification`, only the sources of findings it found citable, each with its finding's judgement."""
    checks = _verifying(verification)
    sources: list[Citation] = []
    seen: set[tuple[str, str]] = set()
    for entry in _shown_findings(entries, verification):
        judgement = None if checks is None else checks.judgement_of(entry.sequence_no)
        for source in entry.sources:
            key = (source.url, source.excerpt)
            if not source.excerpt or key in seen:
                continue
            seen.add(key)
            number = len(sources) + 1
            sources.append(Citation(number, source.url, source.title, source.excerpt, entry.sequence_no, judgement))
    return sources


def synthesis_messages(
    question: str,
    entries: Sequence[Entry],
    sources: Sequence[Citation],
    notes: str,
    verification: Verification | None = None,
) -> list[Message]:
    verification = _verifying(verification)
    numbers = {(source.url, source.excerpt): source.number for source in sources}
    contested = verification.contested() if verification is not None else {}
    findings = []
    for entry in _shown_findings(entries, verification):
        cited = sorted({numbers[(s.url, s.excerpt)] for s in entry.sources if (s.url, s.excerpt) in numbers})
        marks = "".join(f"[{n}]" for n in cited)
        judged = ""
        if verification is not None and (judgement := verification.judgement_of(entry.sequence_no)) is not None:
            judged = f", {judgement.value.replace('_', ' ')}"
        if entry.sequence_no in contested:
            others = ", ".join(map(str, sorted(contested[entry.sequence_no])))
            judged += f", contested by {'finding' if len(contested[entry.sequence_no]) == 1 else 'findings'} {others}"
        findings.append(f"- ({entry.kind} {entry.sequence_no}{judged}) {entry.content} {marks}")
    listed = [f'[{s.number}] {s.title or s.url} — {s.url}\n    "{s.excerpt}"' for s in sources]
    parts = [f"Question: {question}"]
    parts.append("Verified findings:\n" + ("\n".join(findings) if findings else "(none were promoted)"))
    parts.append("Sources:\n" + ("\n".join(listed) if listed else "(none)"))
    if verification is not None and verification.contradictions:
        disagreements = "\n".join(_disagreement(c) for c in verification.contradictions)
        parts.append(
            "Where sources disagree (report each as a disagreement between the sources, citing both, never as "
            f"fact):\n{disagreements}"
        )
    if notes.strip():
        parts.append(f"Notes from the research phase:\n{notes.strip()}")
    instructions = INSTRUCTIONS if verification is None else f"{INSTRUCTIONS} {VERIFIED_INSTRUCTIONS}"
    return [system(instructions), user("\n\n".join(parts))]


def _disagreement(contradiction: Contradiction) -> str:
    return (
        f'- A finding claims: {contradiction.claim}\n    {contradiction.finding_url} says: "'
        f'{contradiction.finding_excerpt}"\n    but {contradiction.contradicting_url} says: "'
        f'{contradiction.contradicting_excerpt}"'
    )


@dataclass(frozen=True)
class ResearchEnd:
    """Why the research phase ended, as the report records it."""

    notes: str = ""  # the supervisor's last words on what the report should cover
    token_budget_exhausted: bool = False
    turn_budget_exhausted: bool = False
    delegations: int = 0  # delegations that went out to a worker


def report_warnings(
    report: Report,
    end: ResearchEnd,
    usage: Usage,
    verification: Verification | None = None,
    *,
    roles_failed: bool = False,
) -> tuple[RunWarning, ...]:
    """Why a report cites no verified source, if it cites none (prose without sources is not research), whether
    its review left cited sentences unaudited (`roles_failed`: because the model could not follow the review
    roles' contracts), and whether the run's token counts are estimates."""
    estimated = (RunWarning.USAGE_ESTIMATED,) if usage.estimated_calls else ()
    if roles_failed:
        estimated = (RunWarning.ROLES_CANNOT_FOLLOW_CONTRACTS, *estimated)
    if verification is not None and (roles_failed or _review_unfinished(verification)):
        estimated = (RunWarning.VERIFICATION_INCOMPLETE, *estimated)
    if report.citations:
        return estimated
    return ((RunWarning.NO_SOURCES,) if end.delegations else (RunWarning.NO_DELEGATIONS,)) + estimated


def _review_unfinished(verification: Verification) -> bool:
    """Some finding no verifier could judge (it is then not cited), or some cited sentence no auditor judged."""
    unjudged = any(finding.judgement is None for finding in verification.findings)
    return unjudged or any(sentence.status is SentenceStatus.UNAUDITED for sentence in verification.sentences)


async def write_report(
    model: ModelClient,
    question: str,
    entries: Sequence[Entry],
    end: ResearchEnd,
    out: TextStream,
    verification: Verification | None = None,
) -> tuple[Report, Usage]:
    """One model call without tools; its text streams through the citation filter to `out`.

    `verification`: the claim checks of a run that verifies (verify_claims); None (or one not enabled):
    every finding may be cited, as without verification."""
    sources = verified_sources(entries, verification)
    citations = CitationFilter({source.number: source for source in sources})
    text: list[str] = []

    async def stream(delta: str) -> None:
        safe = citations.feed(delta)
        text.append(safe)
        await out.add(safe)

    reply = await model.complete(
        synthesis_messages(question, entries, sources, end.notes, verification),
        (),
        call_id_prefix="report",
        on_text=stream,
    )
    rest = citations.finish()
    text.append(rest)
    await out.add(rest)
    await out.flush()
    report = Report(
        markdown="".join(text),
        citations=citations.citations(),
        removed_citations=citations.removed,
        invalid_markers=tuple(citations.invalid_at),
        token_budget_exhausted=end.token_budget_exhausted,
        turn_budget_exhausted=end.turn_budget_exhausted,
    )
    return report, reply.usage + Usage(model_calls=1)


@dataclass
class CitationFilter:
    """Streams report text through, holding back a possible [n, m] or [n-m] marker until it closes.

    Every number in a marker that names no source is removed and counted; a
    marker too long to be a citation list is removed whole and counted once.
    `invalid_at` keeps where in the filtered text each such cut was made.
    """

    sources: dict[int, Citation]
    removed: int = 0
    cited: set[int] = field(default_factory=set)
    invalid_at: list[int] = field(default_factory=list)  # offsets in the text let through
    _pending: str = ""
    _emitted: int = 0  # characters let through so far

    def feed(self, text: str) -> str:
        out: list[str] = []
        for char in text:
            if not self._pending:
                if char == "[":
                    self._pending = char
                else:
                    self._emit(out, char)
                continue
            if char == "]":
                self._emit(out, self._resolve(self._pending[1:]))
                self._pending = ""
            elif char == "[":
                if self._pending == _OVERFLOW:  # a marker too long to be one, never closed: gone, and counted
                    self._cut()
                else:
                    self._emit(out, self._pending)  # not a marker after all; a new one may start here
                self._pending = char
            elif self._pending == _OVERFLOW:
                if char not in _MARKER_CHARS:  # never closed: the swallowed marker is gone, and counted
                    self._cut()
                    self._emit(out, char)
                    self._pending = ""
            elif char in _MARKER_CHARS:
                if len(self._pending) < _MAX_MARKER:
                    self._pending += char
                else:
                    self._pending = _OVERFLOW  # too long to be a citation list: dropped and counted
            else:
                self._emit(out, self._pending + char)
                self._pending = ""
        return "".join(out)

    def finish(self) -> str:
        rest, self._pending = self._pending, ""
        if rest == _OVERFLOW:
            self._cut()
            return ""
        self._emitted += len(rest)
        return rest

    def _emit(self, out: list[str], text: str) -> None:
        out.append(text)
        self._emitted += len(text)

    def _cut(self, numbers: int = 1) -> None:
        self.removed += numbers
        self.invalid_at.append(self._emitted)

    def _resolve(self, inner: str) -> str:
        if inner == _OVERFLOW[1:]:
            self._cut()
            return ""
        numbers = _numbers(inner)
        if numbers is None:
            return f"[{inner}]"  # no number in it: not a citation
        valid = [n for n in dict.fromkeys(numbers) if n in self.sources]
        invalid = len({n for n in numbers if n not in self.sources})
        if invalid:
            self._cut(invalid)
        self.cited.update(valid)
        return f"[{', '.join(str(n) for n in valid)}]" if valid else ""

    def citations(self) -> tuple[Citation, ...]:
        return tuple(self.sources[n] for n in sorted(self.cited))


def _numbers(inner: str) -> list[int] | None:
    """The numbers a marker names ("1, 3-5" is 1, 3, 4, 5); None when it names none."""
    numbers: list[int] = []
    for part in inner.replace(_EN_DASH, "-").split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        if not low.strip().isdigit() or (dash and not high.strip().isdigit()):
            return None
        first, last = int(low), int(high) if dash else int(low)
        if last < first or last - first > _MAX_RANGE:
            numbers.append(-1)  # names something, but no source list this long: unresolvable
            continue
        numbers.extend(range(first, last + 1))
    return numbers or None
