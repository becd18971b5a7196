"""A Markdown report as sentences: spans, the findings each cites, and the report rebuilt without some."""

from __future__ import annotations

import gc
import time

import pytest

from quarry.records.research import CitationCheck
from supervisor_svc.runs.domain import Citation
from supervisor_svc.runs.synthesis import CitationFilter
from supervisor_svc.verification.checks import flag_draft
from supervisor_svc.verification.sentences import cite_findings, split_report

# Sources [1] and [2] come from finding 12, [3] from finding 14.
SOURCES = (
    Citation(1, "https://a.example", "A", "first excerpt", 12),
    Citation(2, "https://a.example", "A", "second excerpt", 12),
    Citation(3, "https://b.example", "B", "third excerpt", 14),
)
REPORT = """# The Eiffel Tower

The tower opened in 1889 [1]. It is about 3.5 times taller than, e.g. the Statue of Liberty [1, 3].
Dr. Smith measured it in 1959. [3] Nobody disputes that!

- J. Doe led the works [2].
- A second item without a citation

```
Code. Never a sentence [1].
```

> A quoted line [3].
"""


def texts(markdown: str) -> list[str]:
    return [sentence.text for sentence in split_report(markdown, SOURCES).sentences]


def test_sentences_keep_their_markers_spans_and_findings() -> None:
    draft = split_report(REPORT, SOURCES)
    assert [(s.index, s.text, s.source_numbers, s.finding_sequence_nos) for s in draft.sentences] == [
        (0, "The Eiffel Tower", (), ()),
        (1, "The tower opened in 1889 [1].", (1,), (12,)),
        (2, "It is about 3.5 times taller than, e.g. the Statue of Liberty [1, 3].", (1, 3), (12, 14)),
        (3, "Dr. Smith measured it in 1959. [3]", (3,), (14,)),
        (4, "Nobody disputes that!", (), ()),
        (5, "J. Doe led the works [2].", (2,), (12,)),
        (6, "A second item without a citation", (), ()),
        (7, "A quoted line [3].", (3,), (14,)),
    ]
    for sentence in draft.sentences:
        assert " ".join(REPORT[sentence.start : sentence.end].split()) == sentence.text
    assert [s.index for s in draft.cited()] == [1, 2, 3, 5, 7]


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("It rose (see [1].) Then it fell [2].", ["It rose (see [1].)", "Then it fell [2]."]),
        ('He said "it is tall." It is [1].', ['He said "it is tall."', "It is [1]."]),
        (
            "Heights vary, i.e. by season [1]. Really? Yes [2].",
            ["Heights vary, i.e. by season [1].", "Really?", "Yes [2]."],
        ),
        (
            "Version 2.0 shipped [1]. See example.com for more.",
            ["Version 2.0 shipped [1].", "See example.com for more."],
        ),
        ("It rose in 1889. it stayed [1].", ["It rose in 1889. it stayed [1]."]),
        ("**Height.** It is tall [1].", ["**Height.**", "It is tall [1]."]),
        ("A line\nrunning on [1]. Next.", ["A line running on [1].", "Next."]),
        ("1. First item [1].\n2. Second item [2].", ["First item [1].", "Second item [2]."]),
        ("---\n\n| a | b [1] |\n|---|---|\n", ["| a | b [1] |"]),
    ],
)
def test_splitting_is_robust(markdown: str, expected: list[str]) -> None:
    assert texts(markdown) == expected


def test_a_marker_naming_no_source_cites_nothing() -> None:
    (sentence,) = split_report("It is tall [7].", SOURCES).sentences
    assert (sentence.source_numbers, sentence.cited) == ((), False)


def test_markers_are_rewritten_as_the_findings_they_cite() -> None:
    sources = {s.number: s for s in SOURCES}
    assert (
        cite_findings("Tall [1, 2] and old [3]; not [9].", sources) == "Tall [finding 12] and old [finding 14]; not ."
    )
    assert cite_findings("Both [1-3].", sources) == "Both [findings 12, 14]."


def test_the_report_is_rebuilt_with_sentences_replaced_and_removed() -> None:
    draft = split_report(REPORT, SOURCES)
    rebuilt = draft.rebuild({1: "The tower opened in May 1889 [2]."}, removed={2, 4, 5, 7})
    assert rebuilt == (
        "# The Eiffel Tower\n\n"
        "The tower opened in May 1889 [2].\nDr. Smith measured it in 1959. [3]\n\n"
        "- A second item without a citation\n\n"
        "```\nCode. Never a sentence [1].\n```\n"
    )
    # A paragraph removed whole takes its blank line with it; nothing changed gives the report back.
    assert draft.rebuild({}, removed={1, 2, 3, 4}) == REPORT.replace(
        "The tower opened in 1889 [1]. It is about 3.5 times taller than, e.g. the Statue of Liberty [1, 3].\n"
        "Dr. Smith measured it in 1959. [3] Nobody disputes that!\n\n",
        "",
    )
    assert draft.rebuild({}, ()) == REPORT


def _hostile_report(scale: int) -> str:
    return ("." * 5000 + "[" + "1" * 5000 + " ") * 2 * scale + "e.g. " * 2000 * scale + "x. y " * 5000 * scale


def _split_seconds(report: str) -> float:
    # The collector is not what is measured: a full collection of a test worker's heap landing in
    # one timing would swamp it. Nor are the other processes and threads the suite runs beside it: the
    # time is this thread's CPU time, which a busy machine does not stretch the way it stretches the clock.
    gc.disable()
    try:
        started = time.thread_time()
        split_report(report, SOURCES)
        return time.thread_time() - started
    finally:
        gc.enable()


def test_splitting_is_linear_in_the_report() -> None:
    # A ratio measured in one run, not a wall-clock bound: 4x the text takes about 4x the time when
    # splitting is linear, 16x when quadratic. Interleaved rounds, best of five, damp a noisy machine.
    small, large = _hostile_report(3), _hostile_report(12)
    small_times, large_times = [], []
    for _ in range(5):
        small_times.append(_split_seconds(small))
        large_times.append(_split_seconds(large))
    ratio = min(large_times) / min(small_times)
    assert ratio < 8, f"4x the text took {ratio:.1f}x the time"


@pytest.mark.parametrize(
    ("markdown", "cut", "flagged"),
    [
        ("It is tall [9]. It is old [1].", "[9]", 0),  # inside its sentence
        ("It is tall. [9] It is old [1].", "[9]", 0),  # after its stop, on its line
        ("[9] It is tall.", "[9]", 0),  # before the sentence, on its line
        ("The tower is tall [1].\n\n```\nx = a[9]\n```", "[9]", None),  # in a code block: no sentence
        ("The tower is tall [1].\n\n---\n[9]\n", "[9]", None),  # on a line of its own
    ],
    ids=["inside", "after", "before", "code-block", "own-line"],
)
def test_a_cut_marker_belongs_to_the_sentence_on_its_line_or_to_none(
    markdown: str, cut: str, flagged: int | None
) -> None:
    sources = [Citation(1, "https://a.example/", "A", "a", 2)]
    citations = CitationFilter({source.number: source for source in sources})
    text = citations.feed(markdown) + citations.finish()
    assert citations.invalid_at == [markdown.index(cut)]
    flags = flag_draft(split_report(text, sources), citations.invalid_at, {})
    assert list(flags) == ([] if flagged is None else [flagged])
    assert all(flag.check is CitationCheck.INVALID_MARKER for flag in flags.values())


def test_a_marker_too_long_to_be_one_is_cut_and_kept_where_even_before_another_bracket() -> None:
    citations = CitationFilter({})
    text = citations.feed("Claim [" + "1," * 150 + "[ more.") + citations.finish()
    assert text == "Claim [ more." and "\x00" not in text
    assert (citations.removed, citations.invalid_at) == (1, [len("Claim ")])
