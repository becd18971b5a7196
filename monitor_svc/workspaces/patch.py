"""Unified diffs, parsed and applied in memory as pure functions (no file system, no `patch`, no git).

The diffs `diff -u` and `git diff` print are understood: `---`/`+++` headers with or without git's
a/ and b/ prefixes (and diff's timestamps), git's extended headers (new and deleted files, renames,
modes, which are ignored), quoted paths and "\\ No newline at end of file". A hunk applies where its
old lines are found exactly, at the line its header names or, as with git, at the nearest other
place after the previous hunk; there is no fuzz. Binary patches and copies are refused.

Lines are split on "\\n" only, so a file's "\\r\\n" endings are kept and must match the patch's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = "\\"  # "\ No newline at end of file" (the text after the backslash varies by locale)
_DEV_NULL = "/dev/null"
_ESCAPES = {"a": "\a", "b": "\b", "t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}
_MAX_SHOWN = 80


class PatchSyntaxError(ValueError):
    """The text is not a unified diff this module can apply; the message says where."""


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    header: str  # the "@@ ... @@" part of its first line
    old_lines: tuple[str, ...]  # with their "\n" where they have one
    new_lines: tuple[str, ...]


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # None: the patch creates the file
    new_path: str | None  # None: the patch deletes it
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        """The path the patch is known by: the new one, or the old for a deletion."""
        name = self.new_path or self.old_path
        assert name is not None  # the parser never builds a patch without either
        return name


class HunkFailed(Exception):
    """A file patch does not apply to the file's content; `hunk` counts from 1 (None: the file as a whole)."""

    def __init__(self, path: str, hunk: int | None, header: str, reason: str) -> None:
        where = f"hunk {hunk} ({header})" if hunk is not None else "the patch"
        super().__init__(f"{where} does not apply to {path}: {reason}")
        self.path = path
        self.hunk = hunk
        self.header = header
        self.reason = reason


def split_lines(text: str) -> list[str]:
    """Lines with their "\\n" (the last without one if the text does not end with it); "\\r" stays put."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


# -- parsing ------------------------------------------------------------------------------------------


def _unquote(name: str) -> str:
    """A path as git writes it: C-quoted when it holds unusual characters (octal escapes are UTF-8 bytes)."""
    if not (len(name) >= 2 and name.startswith('"') and name.endswith('"')):
        return name
    body, out, index = name[1:-1], bytearray(), 0
    while index < len(body):
        char = body[index]
        if char != "\\":
            out.extend(char.encode())
            index += 1
            continue
        following = body[index + 1 : index + 2]
        if following in _ESCAPES:
            out.extend(_ESCAPES[following].encode())
            index += 2
        elif re.fullmatch(r"[0-7]{3}", body[index + 1 : index + 4]):
            out.append(int(body[index + 1 : index + 4], 8))
            index += 4
        else:
            raise PatchSyntaxError(f"bad escape in the quoted path {name}")
    return out.decode(errors="surrogateescape")


def _header_path(line: str, marker: str) -> str | None:
    """The path of a "--- " or "+++ " line, without diff's timestamp; None for /dev/null."""
    name = line[len(marker) :]
    if not name.startswith('"') and "\t" in name:
        name = name.split("\t", 1)[0]
    name = _unquote(name.removesuffix("\r"))
    return None if name == _DEV_NULL else name


def _git_paths(line: str) -> tuple[str, str] | None:
    """Both paths of a "diff --git a/X b/Y" line when they can be told apart (quoted, or X == Y)."""
    rest = line[len("diff --git ") :]
    quoted = re.fullmatch(r'("(?:[^"\\]|\\.)*"|\S+) ("(?:[^"\\]|\\.)*"|\S+)', rest)
    if quoted and (rest.startswith('"') or rest.endswith('"')):
        return _unquote(quoted.group(1)), _unquote(quoted.group(2))
    for index in (match.start() for match in re.finditer(" b/", rest)):
        old, new = rest[:index], rest[index + 1 :]
        if old.startswith("a/") and old[2:] == new[2:]:
            return old, new
    return None


def _strip_prefixes(old: str | None, new: str | None) -> tuple[str | None, str | None]:
    """Drop git's a/ and b/ when both sides carry them (a side that is /dev/null agrees with anything)."""
    if (old is None or old.startswith("a/")) and (new is None or new.startswith("b/")) and (old or new):
        return (old[2:] if old else None), (new[2:] if new else None)
    return old, new


@dataclass
class _Section:
    """What is known of one file's patch while its headers are read."""

    git_paths: tuple[str, str] | None = None
    created: bool = False
    deleted: bool = False
    rename_from: str | None = None
    rename_to: str | None = None
    old: str | None = None
    new: str | None = None
    has_headers: bool = False

    def finish(self, hunks: list[Hunk], line_number: int) -> FilePatch:
        if self.has_headers:
            old, new = _strip_prefixes(self.old, self.new)
        elif self.rename_from is not None and self.rename_to is not None:
            old, new = self.rename_from, self.rename_to
        elif self.git_paths is not None:
            old, new = _strip_prefixes(*self.git_paths)
            old, new = (None if self.created else old), (None if self.deleted else new)
        else:
            raise PatchSyntaxError(f"line {line_number}: a file section without '---' and '+++' lines")
        if self.rename_from is not None and self.rename_to is not None and old is not None and new is not None:
            old, new = self.rename_from, self.rename_to  # exact, where the headers may carry prefixes
        if old is None and new is None:
            raise PatchSyntaxError(f"line {line_number}: both sides of a file section are /dev/null")
        return FilePatch(old, new, tuple(hunks))


def _ends_hunk(lines: list[str], index: int) -> bool:
    """lines[index] is not part of the hunk before it: a header, a file section, or the end of the text."""
    if index >= len(lines):
        return True
    line = lines[index]
    if line.startswith(("@@", "diff ")):
        return True
    if line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ "):
        return True
    return line[:1] not in (" ", "+", "-", _NO_NEWLINE, "")


def _hunk(lines: list[str], start: int, path: str) -> tuple[Hunk, int]:
    """The hunk whose "@@" line is lines[start], and the index after it.

    Its lines run to the next hunk or file header: the counts in the "@@" line are not trusted (they
    are easy to get wrong by hand or by a model), and blank lines at its end are not part of it.
    """
    header_line = lines[start]
    match = _HUNK.match(header_line)
    if match is None:
        raise PatchSyntaxError(f"line {start + 1}: a malformed hunk header {header_line[:_MAX_SHOWN]!r}")
    end = start + 1
    while not _ends_hunk(lines, end):
        end += 1
    body_end = end
    while body_end > start + 1 and lines[body_end - 1] == "":
        body_end -= 1
    old: list[str] = []
    new: list[str] = []
    last: list[list[str]] = []  # the lists the previous line went to, for "\ No newline"
    for line in lines[start + 1 : body_end]:
        tag, text = (line[:1], line[1:] + "\n") if line else (" ", "\n")  # an empty line: blank context
        if tag == _NO_NEWLINE:
            for target in last:
                target[-1] = target[-1].removesuffix("\n")
            continue
        last = [old, new] if tag == " " else [old] if tag == "-" else [new]
        for target in last:
            target.append(text)
    if not old and not new:
        raise PatchSyntaxError(f"line {start + 1}: hunk {match.group(0)} of {path} has no lines")
    old_count = int(match.group(2)) if match.group(2) is not None else 1
    new_count = int(match.group(4)) if match.group(4) is not None else 1
    hunk = Hunk(int(match.group(1)), old_count, int(match.group(3)), new_count, match.group(0), tuple(old), tuple(new))
    return hunk, end


def parse_patch(text: str) -> list[FilePatch]:
    """Every file's patch in `text`, in order; PatchSyntaxError says what is wrong and where."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    patches: list[FilePatch] = []
    section: _Section | None = None
    hunks: list[Hunk] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("diff --git "):
            if section is not None:
                patches.append(section.finish(hunks, index))
            section, hunks = _Section(git_paths=_git_paths(line)), []
        elif line.startswith(("GIT binary patch", "Binary files ")):
            raise PatchSyntaxError(f"line {index + 1}: binary patches are not supported")
        elif line.startswith(("copy from ", "copy to ")):
            raise PatchSyntaxError(f"line {index + 1}: copies are not supported; add the file instead")
        elif section is not None and not section.has_headers and line.startswith("new file mode"):
            section.created = True
        elif section is not None and not section.has_headers and line.startswith("deleted file mode"):
            section.deleted = True
        elif section is not None and not section.has_headers and line.startswith("rename from "):
            section.rename_from = _unquote(line[len("rename from ") :])
        elif section is not None and not section.has_headers and line.startswith("rename to "):
            section.rename_to = _unquote(line[len("rename to ") :])
        elif line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ "):
            if section is not None and (section.has_headers or hunks):
                patches.append(section.finish(hunks, index))
                section = None
            section = section or _Section()
            section.old, section.new = _header_path(line, "--- "), _header_path(lines[index + 1], "+++ ")
            section.has_headers, hunks = True, []
            index += 1
        elif line.startswith("@@"):
            if section is None or not section.has_headers:
                raise PatchSyntaxError(f"line {index + 1}: a hunk before any '---' and '+++' lines")
            hunk, index = _hunk(lines, index, section.new or section.old or "?")
            hunks.append(hunk)
            continue
        index += 1  # anything else between sections (a commit message, "index ..." lines) is skipped
    if section is not None:
        patches.append(section.finish(hunks, len(lines)))
    if not patches:
        raise PatchSyntaxError("no file changes found: expected '--- a/PATH' and '+++ b/PATH' lines, then '@@' hunks")
    return patches


# -- applying -----------------------------------------------------------------------------------------


def _shown(line: str) -> str:
    return repr(line if len(line) <= _MAX_SHOWN else line[:_MAX_SHOWN] + "...")


def _find(lines: list[str], wanted: tuple[str, ...], expected: int, lowest: int) -> int | None:
    """Where `wanted` occurs in `lines` at or after `lowest`, the nearest to `expected` first."""
    highest = len(lines) - len(wanted)
    if not wanted:
        return expected if lowest <= expected <= len(lines) else None
    size = len(wanted)
    for distance in range(max(expected - lowest, highest - expected) + 1):
        for at in (expected - distance, expected + distance) if distance else (expected,):
            if lowest <= at <= highest and tuple(lines[at : at + size]) == wanted:
                return at
    return None


def _mismatch(lines: list[str], wanted: tuple[str, ...], at: int) -> str:
    """Why `wanted` is not at line `at` (0-based), for the error message."""
    for offset, line in enumerate(wanted):
        number = at + offset
        if number >= len(lines):
            return f"the file has {len(lines)} lines; the hunk expects {_shown(line)} at line {number + 1}"
        if lines[number] != line:
            return f"line {number + 1} is {_shown(lines[number])}, the hunk expects {_shown(line)}"
    return "its lines are not where it says, nor anywhere after the previous hunk"


def apply_file_patch(patch: FilePatch, original: str | None) -> str | None:
    """The file's new content (None: deleted) after `patch`; `original` is None when it does not exist."""
    path = patch.path
    if patch.old_path is None and original is not None:
        raise HunkFailed(path, None, "", "the patch creates the file, but it exists")
    if patch.old_path is not None and original is None:
        raise HunkFailed(path, None, "", "the file does not exist")
    lines = split_lines(original or "")
    out: list[str] = []
    done = 0  # lines of the original consumed
    offset = 0  # where the previous hunk applied, relative to where its header said
    for number, hunk in enumerate(patch.hunks, 1):
        # A header counting no old lines inserts after line old_start; any other replaces from old_start.
        stated = hunk.old_start if hunk.old_count == 0 else max(hunk.old_start - 1, 0)
        expected = min(max(stated + offset, done), len(lines))
        at = _find(lines, hunk.old_lines, expected, done)
        if at is None:
            raise HunkFailed(path, number, hunk.header, _mismatch(lines, hunk.old_lines, expected))
        out.extend(lines[done:at])
        out.extend(hunk.new_lines)
        done, offset = at + len(hunk.old_lines), at - stated
    out.extend(lines[done:])
    result = "".join(out)
    if patch.new_path is None:
        if result:
            remaining = len(split_lines(result))
            raise HunkFailed(path, None, "", f"the patch deletes the file, but {remaining} of its lines are not in it")
        return None
    return result
