"""The citation filter: whatever the model writes, no citation in the report resolves to nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from quarry.identity import Principal, Role
from quarry.vocabulary import Entry, EntryKind, Source
from supervisor_svc.runs.domain import Citation
from supervisor_svc.runs.synthesis import CitationFilter, verified_sources
from supervisor_svc.runs.tools import DelegateParams

SOURCES = {n: Citation(n, f"https://example.org/{n}", f"Page {n}", f"quote {n}", 10 + n) for n in (1, 2, 3)}


def filtered(text: str, pieces: int = 1) -> tuple[str, CitationFilter]:
    citations = CitationFilter(dict(SOURCES))
    size = max(1, len(text) // pieces)
    out = "".join(citations.feed(text[i : i + size]) for i in range(0, len(text), size)) + citations.finish()
    return out, citations


@pytest.mark.parametrize("pieces", [1, 3, 1000])
@pytest.mark.parametrize(
    ("text", "expected", "removed", "cited"),
    [
        ("Tall [1].", "Tall [1].", 0, {1}),
        ("Tall [1, 2] and old [9].", "Tall [1, 2] and old .", 1, {1, 2}),
        ("Range [2-4] and [1\u20132].", "Range [2, 3] and [1, 2].", 1, {1, 2, 3}),
        ("Twice [1, 1].", "Twice [1].", 0, {1}),
        ("Trailing [99,].", "Trailing .", 1, set()),
        ("Newline [1,\n99].", "Newline [1].", 1, {1}),
        ("Huge [1-9999].", "Huge .", 1, set()),
        ("Long [" + "1, " * 100 + "99].", "Long .", 1, set()),
        ("A [link](https://x.org) and [note] stay.", "A [link](https://x.org) and [note] stay.", 0, set()),
        ("Empty [] and [ ] stay.", "Empty [] and [ ] stay.", 0, set()),
        ("Unclosed [1", "Unclosed [1", 0, set()),
    ],
)
def test_citations_are_kept_only_when_they_resolve(
    text: str, expected: str, removed: int, cited: set[int], pieces: int
) -> None:
    out, citations = filtered(text, pieces)
    assert (out, citations.removed, citations.cited) == (expected, removed, cited)
    assert [c.number for c in citations.citations()] == sorted(cited)


def test_only_researchers_findings_are_citable_sources() -> None:
    """A claim-verifier's verdict judges a finding; its quote is no source of its own (nor is anyone's note)."""
    moment = datetime.now(UTC)

    def entry(sequence_no: int, kind: EntryKind, role: Role, url: str) -> Entry:
        source = Source(url=url, title="", excerpt=f"quote at {url}")
        return Entry("t", sequence_no, kind, Principal("p", role), "content", (source,), moment)

    entries = [
        entry(1, EntryKind.FINDING, Role.RESEARCHER, "https://example.org/finding"),
        entry(2, EntryKind.VERDICT, Role.VERIFIER, "https://example.org/verdict"),
        entry(3, EntryKind.NOTE, Role.SUPERVISOR, "https://example.org/note"),
    ]
    assert [(c.number, c.url, c.sequence_no) for c in verified_sources(entries)] == [
        (1, "https://example.org/finding", 1)
    ]


def test_the_model_delegates_research_and_never_chooses_a_role_that_reviews_it() -> None:
    """It may order researchers, scouts and extractors; the roles that judge its work are the run's to order."""
    role = DelegateParams.model_json_schema()["properties"]["role"]
    assert role["enum"] == ["researcher", "scout", "extractor"] and role["default"] == "researcher"
    with pytest.raises(ValidationError):
        DelegateParams.model_validate({"objective": "Judge finding 3", "role": "verifier"})
