"""What the corpus reads from a document's text: its title, whether a file is text at all, the hash that
says its text changed, the passages its vectors are computed from, and the snippets a search shows."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

# How much of a file decides whether it is text.
SNIFF_BYTES = 8192
# Characters of text a snippet shows, about FTS5's 24-token snippets.
SNIPPET_CHARS = 200
# Occurrences of the query's words a snippet chooses among: the first ones, in a long text.
SNIPPET_MATCHES = 500
# Words neither the search nor a snippet looks for, beside others: they are everywhere.
_COMMON_WORDS_TEXT = (
    "a an and are as at be by can do does for from how i in is it of on or that the this to what when which why with"
)
COMMON_WORDS = frozenset(_COMMON_WORDS_TEXT.split())


def plain_title(text: str, file: Path) -> str:
    """A Markdown document's first heading, else the file name."""
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return file.stem.replace("-", " ").replace("_", " ")


def is_binary(body: bytes) -> bool:
    """Whether a file's first bytes are not text: a NUL, or over a tenth undecodable or control characters."""
    sample = body[:SNIFF_BYTES]
    if b"\0" in sample:
        return True
    text = sample.decode("utf-8", errors="replace")
    odd = sum(1 for char in text if char == "\ufffd" or (char < " " and char not in "\t\n\r\f\v\b"))
    return odd * 10 > len(text)


def content_hash(title: str, text: str) -> str:
    return hashlib.sha256(f"{title}\0{text}".encode()).hexdigest()


@dataclass(frozen=True)
class PassageSize:
    """How big an embedded passage is, in tokens of the embedding model, and how much consecutive ones overlap.

    Without the model's tokenizer, tokens are estimated at CHARS_PER_TOKEN characters each: fewer than English
    prose has (about 4), as markup, code and numbers do, so that a passage fits the model's window."""

    tokens: int = 256  # the window of common small embedders (all-MiniLM, bge-small: 256 to 512)
    overlap_tokens: int = 32

    @property
    def chars(self) -> int:
        return int(self.tokens * CHARS_PER_TOKEN)

    @property
    def overlap_chars(self) -> int:
        return int(self.overlap_tokens * CHARS_PER_TOKEN)


CHARS_PER_TOKEN = 3.0
DEFAULT_PASSAGE_SIZE = PassageSize()


def passages(title: str, text: str, size: PassageSize = DEFAULT_PASSAGE_SIZE) -> list[tuple[int, str]]:
    """(where it starts, what is embedded) for each piece of the text that fits `size` with the title (which says
    what the piece is about), cut at whitespace, each overlapping the one before by about `size.overlap_chars`.
    A text without words: its title."""
    heading = title[: size.chars // 4]  # a long title never leaves the text no room
    room = max(size.chars - len(heading) - 2, 50)
    overlap = min(size.overlap_chars, room // 2)
    pieces = []
    start = 0
    while start < len(text):
        end = min(len(text), start + room)
        if end < len(text):
            cut = max(text.rfind(" ", start + room // 2, end), text.rfind("\n", start + room // 2, end))
            end = cut if cut > start else end
        if text[start:end].strip():
            pieces.append((start, f"{heading}\n\n{text[start:end].strip()}"))
        if end >= len(text):
            break
        following = end - overlap
        if overlap and following > start:  # start the next piece at a word inside the overlap
            space = text.find(" ", following, end)
            following = space + 1 if space != -1 else following
        start = max(following, start + 1) if overlap else end
    return pieces or [(0, title or "(no text)")]


def non_blank_chars(text: str) -> int:
    """How many of the text's characters are not whitespace (counted in C: indexing counts whole corpora)."""
    return len("".join(text.split()))


def embedded_share(text: str, pieces: list[tuple[int, str]], title: str, size: PassageSize) -> float:
    """The share of the text's non-blank characters that some passage holds: 1.0 when all of it is embedded."""
    heading = len(title[: size.chars // 4]) + 2
    spans = []
    for start, piece in pieces:
        body = piece[heading:]
        at = text.find(body, start) if body else -1
        if at != -1:
            spans.append((at, at + len(body)))
    wanted = non_blank_chars(text)
    if not wanted:
        return 1.0
    held, covered = 0, 0  # non-blank characters held; where the spans so far end
    for start, end in sorted(spans):
        start = max(start, covered)
        if end > start:
            held += non_blank_chars(text[start:end])
            covered = end
    return held / wanted


def stem(word: str) -> str:
    """A word less its commonest English endings, so that `towers` finds `tower` (a little of what porter does)."""
    word = word.lower()
    for ending in ("ing", "ed", "es", "s"):
        if word.endswith(ending) and len(word) - len(ending) >= 3:
            return word[: -len(ending)]
    return word


def snippet(text: str, query: str, passage: int | None) -> str:
    """About SNIPPET_CHARS of the text where the most of the query's words occur together; where none
    does, the passage the vectors matched, else the beginning. Whitespace collapsed, but a table's rows
    stay one per line; cuts marked."""
    if len(text) <= SNIPPET_CHARS:
        return _collapsed(text)
    words = [word.lower() for word in re.findall(r"\w+", query)]
    stems = {stem(word) for word in ([word for word in words if word not in COMMON_WORDS] or words)}
    begin = passage or 0
    if stems:
        alternatives = "|".join(re.escape(stem) for stem in sorted(stems, key=len, reverse=True))
        # Lower case is the text's own length but for a few letters, and is searched twice as fast as IGNORECASE.
        pattern = re.compile(rf"\b({alternatives})")
        found = [(match.start(), match.group(1)) for match in islice(pattern.finditer(text.lower()), SNIPPET_MATCHES)]
        best_count, end = 0, 0
        for index, (position, _) in enumerate(found):
            while end < len(found) and found[end][0] < position + SNIPPET_CHARS * 4 // 5:
                end += 1
            count = len({stem for _, stem in found[index:end]})
            if count > best_count:
                best_count, begin = count, max(0, position - SNIPPET_CHARS // 5)
    begin = min(begin, len(text) - SNIPPET_CHARS)
    if begin > 0:  # start at a word
        space = re.compile(r"\s").search(text, begin, begin + 30)
        begin = space.end() if space else begin
    end = begin + SNIPPET_CHARS
    if end < len(text):  # and end at one
        space_at = max(text.rfind(" ", end - 30, end), text.rfind("\n", end - 30, end))
        end = space_at if space_at > begin else end
    piece = _collapsed(text[begin:end])
    return ("… " if begin > 0 else "") + piece + (" …" if end < len(text) else "")


def _collapsed(text: str) -> str:
    """The text on one line, except that each row of a table ("| a | b |", as extraction writes tables) keeps
    a line of its own: rows run together read as one line of pipes."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    joined, previous = "", ""
    for line in filter(None, lines):
        if joined:
            joined += "\n" if _row(line) or _row(previous) else " "
        joined += line
        previous = line
    return joined


def _row(line: str) -> bool:
    return line.startswith("|") or line.endswith("|")
