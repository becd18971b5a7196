"""A document's title: an HTML page's `<title>` without its site's suffix, else its first `<h1>`; never the
heading of an admonition ("Note", "Warning", "Tip"), which documentation pages are full of. A PDF's title is
its metadata's, else the first line of its first page that reads as a heading."""

from __future__ import annotations

import re
from typing import Any

# What separates a page's own title from its site's in a <title>: "CREATE SEQUENCE — PostgreSQL 17 docs".
_SITE_SEPARATORS = re.compile(r"\s+(?:[|\u2014\u2013\u00b7]|-{1,2}|::)\s+")
# The headings of admonition boxes, which are never a page's title.
ADMONITIONS = frozenset(
    {
        "note",
        "notes",
        "warning",
        "warnings",
        "tip",
        "tips",
        "hint",
        "important",
        "caution",
        "danger",
        "attention",
        "error",
        "see also",
        "todo",
        "seealso",
        "deprecated",
    }
)
_ADMONITION_CLASSES = ("admonition", "note", "warning", "tip", "caution", "important", "hint", "danger", "callout")
_MAX_TITLE_CHARS = 300
_MAX_HEADING_LINE_CHARS = 150


def html_title(root: Any) -> str:
    """The page's title from its parsed tree (lxml), or "" when it has none worth the name."""
    heading = first_h1(root)
    for element in root.iter("title"):
        title = _clean(element.text_content())
        if title:
            return _without_site(title, heading)
    return heading


def first_h1(root: Any) -> str:
    """The text of the first <h1> that is not an admonition's heading."""
    for element in root.iter("h1"):
        if _in_admonition(element):
            continue
        text = _clean(element.text_content()).rstrip("#¶§ ").strip()
        if text and not is_admonition(text):
            return text
    return ""


def pdf_title(metadata_title: str, first_page: str) -> str:
    """The metadata's title, else the first short line of the first page that is a heading, not a comment."""
    title = _clean(metadata_title)
    if title and not is_admonition(title):
        return title
    for line in first_page.splitlines():
        text = _clean(line)
        if not text:
            continue
        if len(text) <= _MAX_HEADING_LINE_CHARS and any(char.isalpha() for char in text) and text[0] not in "#%/;":
            return text
        break  # the first line with text is the body, not a heading
    return ""


def is_admonition(text: str) -> bool:
    return text.strip().rstrip(":").casefold() in ADMONITIONS


def _without_site(title: str, heading: str) -> str:
    """`title` without a site's name: the part the page's own <h1> says, else the part before the separator."""
    parts = [part.strip() for part in _SITE_SEPARATORS.split(title) if part.strip()]
    if len(parts) < 2:
        return title
    if heading:
        for part in parts:
            if part.casefold() == heading.casefold():
                return part
    return parts[0] if not is_admonition(parts[0]) else title


def _in_admonition(element: Any) -> bool:
    for ancestor in element.iterancestors():
        classes = (ancestor.get("class") or "").casefold().split()
        if any(name in classes for name in _ADMONITION_CLASSES):
            return True
    return False


def _clean(text: str) -> str:
    return " ".join(text.split())[:_MAX_TITLE_CHARS]
