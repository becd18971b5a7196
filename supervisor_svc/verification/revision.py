"""The reviser: the supervisor's model on one objected sentence, and what its answer says.

One call without tools per sentence and round, within the run's token budget (its usage is added to the
run's report usage as it is spent). The answer rewrites the sentence, contests the objection (an
adjudicator then decides) or withdraws the sentence.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from quarry.agent.messages import system, user
from quarry.agent.model import ModelClient, ProviderError
from quarry.agent.usage import Usage
from supervisor_svc.runs.budget import TokenBudget
from supervisor_svc.runs.domain import Citation
from supervisor_svc.runs.synthesis import CitationFilter
from supervisor_svc.verification.audits import MAX_FINDINGS_PER_SENTENCE, MAX_SENTENCE_CHARS
from supervisor_svc.verification.resolutions import MAX_REASON_CHARS
from supervisor_svc.verification.sentences import finding_numbers

log = logging.getLogger(__name__)

# Bounds on what one prompt carries.
_MAX_SOURCES_SHOWN = 100
_MAX_EXCERPT_CHARS = 400

REVISER_INSTRUCTIONS = (
    "You revise one sentence of a research report that a citation auditor objected to. You are given the "
    "question, the sentence, the objection, and the numbered sources the report may cite with the findings "
    "they back. Answer with exactly one of:\n"
    "- the rewritten sentence, saying only what its sources support and citing them as [n];\n"
    "- ADJUDICATE: <why the sentence stands as written>, if the objection is wrong;\n"
    "- REMOVE, if no source supports the sentence.\n"
    "Answer with nothing else: no preamble, no quotes around the sentence."
)
_CONTEST = "ADJUDICATE:"
_WITHDRAW = "REMOVE"


@dataclass(frozen=True)
class Rewrite:
    """A rewritten sentence, its markers kept only where they name a source the report may cite."""

    text: str
    findings: tuple[int, ...]  # the findings it cites; none: it is no usable revision
    removed_citations: int  # markers dropped because they named no such source


def withdraws(answer: str) -> bool:
    return answer.rstrip(".").upper() == _WITHDRAW


def contests(answer: str) -> bool:
    return answer.upper().startswith(_CONTEST)


def rewrite(answer: str, sources: dict[int, Citation]) -> Rewrite:
    citations = CitationFilter(sources)
    text = " ".join((citations.feed(answer) + citations.finish()).split())[:MAX_SENTENCE_CHARS]
    _, findings = finding_numbers(text, sources)
    return Rewrite(text, findings[:MAX_FINDINGS_PER_SENTENCE], citations.removed)


class Reviser:
    def __init__(
        self,
        model: ModelClient,
        budget: TokenBudget,
        question: str,
        sources: Mapping[int, Citation],
        claims: Mapping[int, str],
        run_id: str,
    ) -> None:
        self._model = model
        self._budget = budget
        self._question = question
        self._sources = sources
        self._claims = claims
        self._run_id = run_id
        self.usage = Usage()  # what its calls cost, already added to the budget's account

    async def answer(self, index: int, text: str, objection: str, advice: str, round_no: int) -> str | None:
        """The model's answer on objected sentence `index`: a revision, a contest or REMOVE; None if it gave
        none (the budget is spent, the provider failed, or it answered nothing)."""
        if self._budget.spent():
            return None
        heading = f"Revise sentence {index}" + (f" (round {round_no})" if round_no > 1 else "")
        parts = [
            f"Task: {heading}",
            f"Question: {self._question}",
            f"The sentence: {text[:MAX_SENTENCE_CHARS]}",
            f"The objection: {objection[:MAX_REASON_CHARS]}",
        ]
        if advice:
            parts.append(f"An adjudicator asked for a revision: {advice[:MAX_REASON_CHARS]}")
        parts.append("Sources the report may cite:\n" + self._sources_listing())
        try:
            reply = await self._model.complete(
                [system(REVISER_INSTRUCTIONS), user("\n\n".join(parts))], (), call_id_prefix="revise"
            )
        except ProviderError as error:
            log.warning("run %s: revising sentence %d failed: %s", self._run_id, index, error)
            return None
        usage = reply.usage + Usage(model_calls=1)
        self.usage += usage
        self._budget.account.report += usage
        # A sentence in quotes is still the sentence.
        answer = reply.message.content.strip().strip('"\u201c\u201d').strip()
        return answer or None

    def _sources_listing(self) -> str:
        lines = []
        for source in list(self._sources.values())[:_MAX_SOURCES_SHOWN]:
            claim = self._claims.get(source.sequence_no, "")[:_MAX_EXCERPT_CHARS]
            excerpt = source.excerpt[:_MAX_EXCERPT_CHARS]
            lines.append(f'[{source.number}] finding {source.sequence_no}: {claim}\n    "{excerpt}" ({source.url})')
        return "\n".join(lines) or "(none)"
