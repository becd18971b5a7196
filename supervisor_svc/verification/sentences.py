"""A Markdown report as sentences: what a citation auditor judges, one at a time.

Pure and linear in the report's length. Blocks are read line by line: a heading,
a list item (with its continuation lines), a table row, a quoted line, or a
paragraph; fenced code and rules hold no sentences and are kept as they are.
Inside a block, a sentence ends at ".", "!" or "?" followed by white space and a
word that does not start in lower case, unless the word before the stop is an
abbreviation ("e.g.", "Dr.") or an initial. Citation markers after the stop
("... in 1889. [1]") stay with their sentence, and "3.5" never splits.

Each sentence keeps its span in the Markdown, so the report can be rebuilt
with some sentences rewritten and others removed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from supervisor_svc.runs.domain import Citation
from supervisor_svc.runs.synthesis import CitationFilter

# A citation marker as the report writes it: [1], [2, 3], [4-6].
MARKER = re.compile(r"\[[0-9][0-9, \t\-\u2013]{0,200}\]")
# A sentence's stop, with closing quotes, brackets and emphasis, and any citation markers after it.
_STOP = re.compile(
    r"[.!?\u2026]+[\"'\u201d\u2019)\]*_]*(?:[ \t]*\[[0-9][0-9, \t\-\u2013]{0,200}\][\"'\u201d\u2019)*_]*)*"
)
_HEADING = re.compile(r"[ ]{0,3}#{1,6}(?:[ \t]+|$)")
_ITEM = re.compile(r"[ \t]*(?:[-*+]|[0-9]{1,9}[.)])[ \t]+")
_QUOTE = re.compile(r"[ ]{0,3}>[ \t]?")
_FENCE = re.compile(r"[ ]{0,3}(```|~~~)")
_RULE = re.compile(r"[ ]{0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_TABLE_DELIMITER = re.compile(r"[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_NEXT = re.compile(r"\s*(\S)")
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)$")
# Words a stop after which does not end a sentence (compared in lower case, without the stop).
# fmt: off
ABBREVIATIONS = frozenset(
    {
        "e.g", "i.e", "cf", "vs", "al", "approx", "ca", "dr", "mr", "mrs", "ms", "prof", "st", "no", "nos",
        "fig", "figs", "eq", "vol", "pp", "p", "ed", "eds", "jr", "sr", "inc", "ltd", "co", "corp", "dept",
        "est", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "u.s",
        "u.k", "e.u", "a.m", "p.m", "ph.d", "mt", "ft",
    }
)
# fmt: on


@dataclass(frozen=True)
class Sentence:
    index: int  # its position among the report's sentences, from 0
    text: str  # as written, each run of white space (line breaks too) one space
    start: int  # its span in the Markdown: markdown[start:end]
    end: int
    source_numbers: tuple[int, ...]  # the report's sources its markers name
    finding_sequence_nos: tuple[int, ...]  # the findings those sources come from, in source order
    block: int  # the block (heading, item, paragraph) it belongs to

    @property
    def cited(self) -> bool:
        return bool(self.finding_sequence_nos)


@dataclass(frozen=True)
class Draft:
    """A report split into sentences."""

    markdown: str
    sentences: tuple[Sentence, ...]
    blocks: tuple[tuple[int, int], ...]  # each block's span, whole lines with their line breaks

    def cited(self) -> tuple[Sentence, ...]:
        return tuple(sentence for sentence in self.sentences if sentence.cited)

    def rebuild(self, replaced: Mapping[int, str], removed: Collection[int] = ()) -> str:
        """The Markdown with sentences replaced (by index) and others removed; a block left empty goes whole."""
        gone = set(removed)
        kept_blocks = {s.block for s in self.sentences if s.index not in gone}
        emptied = {s.block for s in self.sentences} - kept_blocks
        edits = [(start, end, "") for start, end in self._emptied_spans(emptied)]
        for sentence in self.sentences:
            if sentence.block in emptied:
                continue
            if sentence.index in gone:
                edits.append((*self._removal_span(sentence), ""))
            elif sentence.index in replaced:
                edits.append((sentence.start, sentence.end, replaced[sentence.index]))
        pieces, position = [], 0
        for start, end, replacement in sorted(edits):
            pieces += [self.markdown[position:start], replacement]
            position = end
        pieces.append(self.markdown[position:])
        return "".join(pieces)

    def _emptied_spans(self, emptied: set[int]) -> list[tuple[int, int]]:
        """The spans of emptied blocks, neighbours (nothing but blank lines between) merged."""
        spans: list[tuple[int, int]] = []
        for block in sorted(emptied):
            start, end = self.blocks[block]
            if spans and not self.markdown[spans[-1][1] : start].strip():
                start = spans.pop()[0]
            spans.append((start, end))
        return [self._with_one_gap(start, end) for start, end in spans]

    def _with_one_gap(self, start: int, end: int) -> tuple[int, int]:
        """A run between blank lines takes one of them along, so no double gap is left."""
        text = self.markdown
        if (start == 0 or text.endswith("\n\n", 0, start)) and text.startswith("\n", end):
            return start, end + 1
        if end == len(text) and text.endswith("\n\n", 0, start):
            return start - 1, end
        return start, end

    def _removal_span(self, sentence: Sentence) -> tuple[int, int]:
        """The sentence and the spaces after it (or, at a line's end, those before it)."""
        text, start, end = self.markdown, sentence.start, sentence.end
        after = end
        while after < len(text) and text[after] in " \t":
            after += 1
        if after > end and after < len(text) and text[after] != "\n":
            return start, after
        before = start
        while before > 0 and text[before - 1] in " \t":
            before -= 1
        return before, after


def finding_numbers(text: str, sources: Mapping[int, Citation]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The source numbers the text's markers name (only sources that exist), and their findings."""
    numbers = _cited(text, sources)
    findings = tuple(dict.fromkeys(sources[n].sequence_no for n in numbers))
    return numbers, findings


def cite_findings(text: str, sources: Mapping[int, Citation]) -> str:
    """The text with each marker naming the findings it cites ("[finding 12]") instead of source numbers."""

    def as_findings(marker: re.Match[str]) -> str:
        _, findings = finding_numbers(marker.group(), sources)
        if not findings:
            return ""
        label = "finding" if len(findings) == 1 else "findings"
        return f"[{label} {', '.join(map(str, findings))}]"

    return MARKER.sub(as_findings, text)


def split_report(markdown: str, sources: Sequence[Citation]) -> Draft:
    """The report's sentences, each with the findings its citations name (`sources`: the report's numbered sources)."""
    numbered = {source.number: source for source in sources}
    blocks: list[tuple[int, int]] = []
    sentences: list[Sentence] = []
    for block_start, block_end, content_start, content_end in _blocks(markdown):
        block = len(blocks)
        blocks.append((block_start, block_end))
        for start, end in _sentence_spans(markdown, content_start, content_end):
            text = " ".join(markdown[start:end].split())
            if not any(char.isalnum() for char in text):
                continue
            numbers, findings = finding_numbers(text, numbered)
            sentences.append(Sentence(len(sentences), text, start, end, numbers, findings, block))
    return Draft(markdown, tuple(sentences), tuple(blocks))


def _cited(text: str, sources: Mapping[int, Citation]) -> tuple[int, ...]:
    citations = CitationFilter(dict(sources))
    citations.feed(text)
    citations.finish()
    return tuple(sorted(citations.cited))


def _lines(markdown: str) -> list[tuple[int, int, int]]:
    """Each line as (start, end of its text, end with its line break)."""
    lines, position = [], 0
    while position < len(markdown):
        newline = markdown.find("\n", position)
        end = len(markdown) if newline < 0 else newline
        lines.append((position, end, end if newline < 0 else end + 1))
        position = end + 1
    return lines


def _blocks(markdown: str) -> list[tuple[int, int, int, int]]:
    """The blocks that hold sentences, as (block start, block end, content start, content end)."""
    found: list[tuple[int, int, int, int]] = []
    lines = _lines(markdown)
    fence = ""
    index = 0
    while index < len(lines):
        start, end, after = lines[index]
        line = markdown[start:end]
        index += 1
        opening = _FENCE.match(line)
        if fence:
            if opening and opening.group(1) == fence:
                fence = ""
            continue
        if opening:
            fence = opening.group(1)
            continue
        if not line.strip() or _RULE.match(line) or _TABLE_DELIMITER.match(line):
            continue
        single = _HEADING.match(line) or _QUOTE.match(line)
        if single or line.lstrip().startswith("|"):
            # One line each: a heading, a quoted line, a table row.
            found.append((start, after, start + (single.end() if single else 0), end))
            continue
        # A list item or a paragraph runs on over lines that start no block of their own.
        item = _ITEM.match(line)
        content_start = start + (item.end() if item else 0)
        while index < len(lines) and _continues(markdown[lines[index][0] : lines[index][1]]):
            end, after = lines[index][1], lines[index][2]
            index += 1
        found.append((start, after, content_start, end))
    return found


def _continues(line: str) -> bool:
    return (
        bool(line.strip())
        and not any(pattern.match(line) for pattern in (_HEADING, _QUOTE, _ITEM, _FENCE, _RULE))
        and not line.lstrip().startswith("|")
    )


def _sentence_spans(markdown: str, start: int, end: int) -> list[tuple[int, int]]:
    spans = []
    sentence_start = start
    for stop in _STOP.finditer(markdown, start, end):
        stop_end = stop.end()
        if stop_end < end and not markdown[stop_end].isspace():
            continue  # "3.5", "e.g.," or a URL's dots: no break
        following = _NEXT.match(markdown, stop_end, end)
        if following and following.group(1).islower():
            continue
        cited = "[" in stop.group()  # a marker after the stop: the sentence surely ended there
        if not cited and stop.group().startswith(".") and _abbreviated(markdown, sentence_start, stop.start()):
            continue
        spans.append(_trimmed(markdown, sentence_start, stop_end))
        sentence_start = stop_end
    spans.append(_trimmed(markdown, sentence_start, end))
    return [(s, e) for s, e in spans if e > s]


def _abbreviated(markdown: str, sentence_start: int, stop: int) -> bool:
    """Whether the word before a stop at `stop` is an abbreviation or an initial."""
    word = _WORD_BEFORE.search(markdown, max(sentence_start, stop - 12), stop)
    if word is None:
        return False
    # Only a whole word counts ("Coll." is not "co").
    if word.start() > sentence_start and markdown[word.start() - 1].isalnum():
        return False
    name = word.group(1).rstrip(".").lower()
    return name in ABBREVIATIONS or (len(name) == 1 and word.group(1)[0].isupper())


def _trimmed(markdown: str, start: int, end: int) -> tuple[int, int]:
    while start < end and markdown[start].isspace():
        start += 1
    while end > start and markdown[end - 1].isspace():
        end -= 1
    return start, end
