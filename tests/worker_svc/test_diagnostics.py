"""What a worker says about its search backend: checked as the worker uses it, without creating anything
and without spending a paid API's quota."""

from __future__ import annotations

from pathlib import Path

from quarry.config import WorkerSettings
from quarry.diagnostics import Finding, Status
from worker_svc.corpus import Corpus
from worker_svc.diagnostics import search_check
from worker_svc.web.search import SearchResult


async def corpus_finding(index: Path) -> Finding:
    corpus = Corpus(index)
    return await search_check(WorkerSettings(corpus_index=str(index)), corpus, corpus).run()


async def test_the_corpus_check_names_a_missing_or_empty_index_and_creates_none(tmp_path: Path) -> None:
    index = tmp_path / "index" / "corpus.db"
    missing = await corpus_finding(index)
    assert (missing.status, missing.setting) == (Status.FAILED, "QUARRY_WORKER_CORPUS_INDEX")
    assert missing.detail.startswith(f"there is no index at {index}; run `quarry corpus index FOLDER`")
    assert not index.parent.exists()
    (tmp_path / "empty").mkdir()
    Corpus(index).index_folder(tmp_path / "empty")
    assert (await corpus_finding(index)).status == Status.FAILED
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("# A\n\nOne document.\n")
    Corpus(index).index_folder(tmp_path / "notes")
    assert await corpus_finding(index) == Finding(Status.OK, f"{index}: 1 document")


class PaidSearch:
    def __init__(self) -> None:
        self.queries: list[str] = []

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        self.queries.append(query)
        return []


async def test_a_paid_search_api_is_not_called_but_a_missing_key_is_named(tmp_path: Path) -> None:
    corpus, paid = Corpus(tmp_path / "corpus.db"), PaidSearch()
    unset = await search_check(WorkerSettings(search_backend="brave"), corpus, paid).run()
    assert unset == Finding(Status.FAILED, "brave needs an API key and none is set", "QUARRY_WORKER_SEARCH_API_KEY")
    key_set = await search_check(WorkerSettings(search_backend="brave", search_api_key="k"), corpus, paid).run()
    assert key_set.status == Status.WARNING
    assert paid.queries == []
