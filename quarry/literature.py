"""Papers by their names: arXiv identifiers in their usual forms, where a paper's full text is read, and
what a paper's analysis asks of the extractor who reads it (a campaign's THINK delegates it)."""

from __future__ import annotations

import re

# New arXiv identifiers (2106.15928, with a version or not) and old ones (hep-th/9901001).
ARXIV_ID = re.compile(r"^(?:\d{4}\.\d{4,5}|[a-z][a-z.-]*/\d{7})(?:v\d+)?$")
_ARXIV_PAGE = re.compile(r"^https?://(?:export\.)?arxiv\.org/(?:abs|pdf|html)/")

PAPER_ANALYSIS = "Analyse the paper at {url}."
PAPER_ANALYSIS_CRITERIA = (
    "one record of kind problem: what the paper sets out to solve",
    "one record of kind method: how it goes about it",
    "a record of kind result for each main result, with its numbers and what they are compared with",
    "a record of kind limitation for each limit or threat the paper states (none when it states none)",
    "each record quotes the paper's own words and says where they are (a section, a table, a page)",
)


def arxiv_id(text: str) -> str:
    """The arXiv identifier in an abs, pdf or html URL or in an id (`arXiv:` prefixed or not), without its
    version; "" when there is none."""
    tail = _ARXIV_PAGE.sub("", text.strip()).removesuffix(".pdf")
    tail = tail.removeprefix("arXiv:").removeprefix("arxiv:")
    return re.sub(r"v\d+$", "", tail) if ARXIV_ID.match(tail) else ""


def full_text_url(paper: str) -> str:
    """Where to read the paper whole: arXiv's PDF for an arXiv id or page (every arXiv paper has one; its HTML
    rendering not always), the URL itself for any other http(s) URL, doi.org's for a DOI."""
    given = paper.strip()
    if identifier := arxiv_id(given):
        return f"https://arxiv.org/pdf/{identifier}"
    if re.match(r"^https?://\S+$", given):
        return given
    doi = re.sub(r"^doi:", "", given, flags=re.IGNORECASE)
    if doi.startswith("10.") and "/" in doi and " " not in doi:
        return f"https://doi.org/{doi}"
    raise ValueError(f"{paper!r} is not an arXiv id, a DOI or the URL of a paper's text")


def paper_analysis(url: str, focus: str = "") -> str:
    """The objective of an extractor's analysis of the paper at `url`."""
    objective = PAPER_ANALYSIS.format(url=url)
    return f"{objective}\nWhat the campaign wants from it: {focus}" if focus.strip() else objective
