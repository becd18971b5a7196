"""Structured outputs: how a claim-verifier, citation auditor or adjudicator ends, and what is checked first.

Such a role ends by calling `submit_<kind>`, whose parameters are its record's fields (structured output
through a tool call, which any OpenAI-compatible server supports). Before anything is recorded, the gate:

1. classifies the output's kind: the tool's (`submit_finding` is a finding), or the `kind` its arguments,
   or a JSON answer given instead of the call, name;
2. refuses a kind the role may not emit (its authority);
3. validates the output against the role's record in quarry.records.research, strictly;
4. checks its references: every scratchpad entry and URL it cites is among the contract's input refs,
   and a quoted passage occurs in a page read in this delegation.

An output refused (2, 4) or malformed (1, 3) is answered with what was wrong, and the role gets one
repair turn; a second failure, or a repair turn without an output, settles the delegation as
OUTPUT_REFUSED or OUTPUT_INVALID, and nothing is recorded. The first valid output settles it too: the
loop ends after that turn (AgentRun's `finished`), and the worker records it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quarry.agent.tools import ToolError, ToolOutcome
from quarry.identity import Role
from quarry.records.base import RecordError
from quarry.records.research import (
    RECORD_TYPES,
    BibliographicVerdict,
    CandidateSources,
    ClaimVerdict,
    ExtractedEvidence,
    InputRefs,
    ResearchRecord,
)
from quarry.vocabulary import DelegationErrorCode, EntryKind
from worker_svc.web.pages import Page
from worker_svc.web.search import SearchResult

SUBMIT_PREFIX = "submit_"

# Every kind a model might try to emit: what each role records, and every entry kind. A structured role
# answers calls to any of their submit tools (it is offered only its own), so that emitting another
# role's kind is refused with a reason, never mistaken for an unknown tool.
OUTPUT_KINDS: tuple[str, ...] = tuple(
    sorted({*(record.record_kind() for record in RECORD_TYPES.values()), *(kind.value for kind in EntryKind)})
)


def submit_tool_name(kind: str) -> str:
    return f"{SUBMIT_PREFIX}{kind}"


def offered_schema(record: type[ResearchRecord]) -> dict[str, Any]:
    """The record's JSON schema as the model fills it in: self-contained (no $ref, which small servers
    handle badly), without `kind` and `schema_version` (the tool's name says them)."""
    schema = record.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(copy.deepcopy(definitions[node["$ref"].rsplit("/", 1)[-1]]))
            # Titles are pydantic's class names, noise to a model (a property named "title" is a dict).
            return {
                key: inline(value) for key, value in node.items() if not (key == "title" and isinstance(value, str))
            }
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    schema = inline(schema)
    for field in ("kind", "schema_version"):
        schema["properties"].pop(field, None)
    schema["required"] = [name for name in schema.get("required", []) if name not in ("kind", "schema_version")]
    return dict(schema)


@dataclass(frozen=True)
class Rejection:
    """Why an output was not accepted: refused (authority, references) or invalid (shape)."""

    code: DelegationErrorCode
    problems: tuple[str, ...]

    @property
    def message(self) -> str:
        verdict = "refused" if self.code is DelegationErrorCode.OUTPUT_REFUSED else "invalid"
        return f"the output was {verdict}: " + "; ".join(self.problems)


class OutputGate:
    """Takes one structured role's output for one delegation: checks each attempt, allows one repair."""

    def __init__(
        self,
        role: Role,
        record: type[ResearchRecord],
        inputs: InputRefs,
        pages_read: Mapping[str, Page],
        listed: Mapping[str, SearchResult] | None = None,
    ) -> None:
        self._role = role
        self._record = record
        self.kind = record.record_kind()
        self._inputs = inputs
        self._pages = pages_read  # the delegation's own, filled as its tools read
        self._listed = listed if listed is not None else {}  # what its searches and look-ups listed
        self._turn = 0
        self._seen: set[str] = set()  # tool call ids the gate answered
        self._first_rejected_turn: int | None = None
        self._last_rejection: Rejection | None = None
        self.accepted: ResearchRecord | None = None
        self.failure: Rejection | None = None

    @property
    def tool_name(self) -> str:
        return submit_tool_name(self.kind)

    @property
    def settled(self) -> bool:
        return self.accepted is not None or self.failure is not None

    @property
    def pending(self) -> Rejection | None:
        """The rejection awaiting its repair, if any."""
        return None if self.settled else self._last_rejection

    def begin_turn(self, turn: int) -> None:
        self._turn = turn

    def submit(self, call_id: str, kind: str, arguments: str) -> str:
        """A `submit_<kind>` call: the tool's answer when accepted; ToolError (the model's to read) when not."""
        self._seen.add(call_id)
        if self.settled:
            raise ToolError(f"this task's output is already {'accepted' if self.accepted else 'settled'}")
        rejection = self._check(kind, arguments)
        if rejection is None:
            return f"accepted: your {self.kind} is recorded when the task ends"
        self._reject(rejection)
        raise ToolError(self._reply(rejection))

    def answer(self, text: str) -> str:
        """A final answer given in prose or JSON instead of the call: checked as an attempt all the same.
        Returns the repair prompt when the role gets its repair turn, "" when the answer settled the output."""
        data = _json_answer(text)
        rejection = (
            Rejection(
                DelegationErrorCode.OUTPUT_INVALID,
                (f"no {self.kind} was submitted: end the task by calling {self.tool_name}",),
            )
            if data is None
            else self._check(self.kind, json.dumps(data))  # a "kind" it names classifies it
        )
        if rejection is None:
            return ""
        self._reject(rejection)
        return "" if self.settled else self._reply(rejection)

    def observe(self, outcome: ToolOutcome) -> None:
        """A submit call the gate never saw (its arguments were no JSON object): a malformed attempt too."""
        name = outcome.call.name
        if name.startswith(SUBMIT_PREFIX) and outcome.call.id not in self._seen and outcome.is_error:
            self._seen.add(outcome.call.id)
            self._reject(Rejection(DelegationErrorCode.OUTPUT_INVALID, (outcome.content.removeprefix("error: "),)))

    def finished(self, turn: int) -> bool:
        """After a turn with tool calls: whether the output is settled, a repair turn without one settling it."""
        if not self.settled and self._first_rejected_turn is not None and turn > self._first_rejected_turn:
            assert self._last_rejection is not None
            self.failure = Rejection(
                self._last_rejection.code,
                (*self._last_rejection.problems, f"the repair turn did not submit a corrected {self.kind}"),
            )
        return self.settled

    def _reject(self, rejection: Rejection) -> None:
        self._last_rejection = rejection
        if self._first_rejected_turn is None:
            self._first_rejected_turn = self._turn
        else:
            self.failure = rejection

    def _reply(self, rejection: Rejection) -> str:
        if self.failure is not None:
            return f"{rejection.message}. That was the last try: the task ends without recording it."
        return (
            f"{rejection.message}. You have one more turn: call {self.tool_name} with the corrected {self.kind}; "
            "nothing else will be recorded."
        )

    def _check(self, kind: str, arguments: str) -> Rejection | None:
        try:
            data = json.loads(arguments or "{}")
        except json.JSONDecodeError as error:
            return Rejection(DelegationErrorCode.OUTPUT_INVALID, (f"the arguments are not JSON: {error}",))
        if not isinstance(data, dict):
            return Rejection(DelegationErrorCode.OUTPUT_INVALID, ("the arguments must be a JSON object",))
        named = data.get("kind")
        emitted = named if isinstance(named, str) else kind
        if emitted != self.kind:
            return Rejection(
                DelegationErrorCode.OUTPUT_REFUSED,
                (
                    f"ROLE_{self._role.name} may not emit {emitted!r}: it ends with one {self.kind} "
                    f"(call {self.tool_name})",
                ),
            )
        try:
            record = self._record.parse(arguments or "{}")
        except RecordError as error:
            return Rejection(DelegationErrorCode.OUTPUT_INVALID, error.problems)
        problems = [
            *self._inputs.outside(record),
            *self._quote_problems(record),
            *self._catalogue_problems(record),
            *self._candidate_problems(record),
            *self._extract_problems(record),
        ]
        if problems:
            return Rejection(DelegationErrorCode.OUTPUT_REFUSED, tuple(problems))
        self.accepted = record
        return None

    def _quote_problems(self, record: ResearchRecord) -> list[str]:
        """A verifier quotes what it read itself: the page in this delegation, the words in that page."""
        if not isinstance(record, ClaimVerdict) or record.quote is None:
            return []
        page = self._pages.get(record.quote.url)
        if page is None:
            return [f"quote.url: {record.quote.url} was not read in this task; read it before quoting it"]
        if not page.contains(record.quote.excerpt):
            return [f"quote.excerpt does not occur in {record.quote.url}; quote the page exactly"]
        return []

    def _catalogue_problems(self, record: ResearchRecord) -> list[str]:
        """A bibliographic verifier copies the catalogue's record it looked up, word for word."""
        if not isinstance(record, BibliographicVerdict) or record.record is None:
            return []
        listed = self._listed.get(record.record.url)
        if listed is None:
            return [f"record.url: {record.record.url} was not listed by look_up_paper in this task; look it up first"]
        problems = []
        if _plain(record.record.title) != _plain(listed.title):
            problems.append(f"record.title is not the catalogue's: {listed.title!r}")
        if tuple(map(_plain, record.record.authors)) != tuple(map(_plain, listed.authors)):
            problems.append(f"record.authors are not the catalogue's: {list(listed.authors)}")
        if record.record.year != listed.year:
            problems.append(f"record.year is not the catalogue's: {listed.year}")
        return problems

    def _candidate_problems(self, record: ResearchRecord) -> list[str]:
        """A scout names only sources its searches and look-ups listed in this task."""
        if not isinstance(record, CandidateSources):
            return []
        return [
            f"candidates[{index}].url: {candidate.url} was not listed by a search in this task; search for it first"
            for index, candidate in enumerate(record.candidates)
            if candidate.url not in self._listed
        ]

    def _extract_problems(self, record: ResearchRecord) -> list[str]:
        """An extractor quotes the one source it read, word for word."""
        if not isinstance(record, ExtractedEvidence):
            return []
        page = self._pages.get(record.source_url)
        if page is None:
            return [f"source_url: {record.source_url} was not read in this task; read it before extracting from it"]
        return [
            f"records[{index}].quote does not occur in {record.source_url}; quote the source exactly"
            for index, extract in enumerate(record.records)
            if not page.contains(extract.quote)
        ]


def _plain(text: str) -> str:
    return " ".join(text.split()).casefold()


def _json_answer(text: str) -> dict[str, Any] | None:
    """The JSON object a prose answer is, fenced in ``` or not; None when it is none."""
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def describe(record: ResearchRecord) -> str:
    """A one-line summary of an accepted output, the delegation's summary."""
    return record.headline()
