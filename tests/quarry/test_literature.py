"""Papers by their names: arXiv identifiers, full-text addresses, and the analysis asked of an extractor."""

from __future__ import annotations

import pytest

from quarry.literature import PAPER_ANALYSIS_CRITERIA, arxiv_id, full_text_url, paper_analysis


@pytest.mark.parametrize(
    ("given", "identifier"),
    [
        ("2106.15928", "2106.15928"),
        ("2106.15928v3", "2106.15928"),
        ("arXiv:2106.15928", "2106.15928"),
        ("https://arxiv.org/abs/2106.15928v2", "2106.15928"),
        ("http://export.arxiv.org/pdf/2106.15928.pdf", "2106.15928"),
        ("https://arxiv.org/html/2106.15928v1", "2106.15928"),
        ("hep-th/9901001", "hep-th/9901001"),
        ("10.1145/3292500.3330701", ""),
        ("https://example.org/abs/2106.15928", ""),
        ("2106.159", ""),
    ],
)
def test_arxiv_ids_are_read_from_their_usual_forms(given: str, identifier: str) -> None:
    assert arxiv_id(given) == identifier


def test_a_papers_full_text_is_arxivs_pdf_the_url_given_or_the_doi() -> None:
    assert full_text_url("arXiv:2106.15928v3") == "https://arxiv.org/pdf/2106.15928"
    assert full_text_url("https://example.org/paper.pdf") == "https://example.org/paper.pdf"
    assert full_text_url("doi:10.1145/3292500.3330701") == "https://doi.org/10.1145/3292500.3330701"
    for nonsense in ("the wind paper", "ftp://example.org/x", "10.1145"):
        with pytest.raises(ValueError, match="not an arXiv id, a DOI or the URL of a paper's text"):
            full_text_url(nonsense)


def test_the_analysis_names_the_paper_and_what_is_wanted_and_asks_for_each_kind() -> None:
    assert paper_analysis("https://arxiv.org/pdf/1") == "Analyse the paper at https://arxiv.org/pdf/1."
    focused = paper_analysis("https://arxiv.org/pdf/1", "its learning rate")
    assert focused.splitlines() == [
        "Analyse the paper at https://arxiv.org/pdf/1.",
        "What the campaign wants from it: its learning rate",
    ]
    kinds = [criterion.split()[4].rstrip(":") for criterion in PAPER_ANALYSIS_CRITERIA[:4]]
    assert kinds == ["problem", "method", "result", "limitation"]
