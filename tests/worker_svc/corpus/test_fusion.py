"""Reciprocal rank fusion, and web results reranked by meaning."""

from __future__ import annotations

from quarry.config import WorkerSettings
from tests.fakes.openai_server import HttpError, ScriptedModel
from tests.worker_svc.corpus.documents import embedder_for
from worker_svc.corpus import RerankedSearch, reciprocal_rank_fusion
from worker_svc.corpus.fusion import Fusion
from worker_svc.web.search import SearchResult, SearchResults


def test_reciprocal_rank_fusion_sums_reciprocal_ranks() -> None:
    # a: 1/61 + 1/62, c: 1/63 + 1/61, b: 1/62, d: 1/63
    assert reciprocal_rank_fusion([["a", "b", "c"], ["c", "a", "d"]]) == ["a", "c", "b", "d"]
    # Second in both lists beats first in one.
    assert reciprocal_rank_fusion([["x", "both"], ["both", "y"]])[0] == "both"
    assert reciprocal_rank_fusion([["x"], ["y"]]) == ["x", "y"], "ties keep the order first seen"


def test_weighted_fusion_lets_the_vectors_first_hit_outrank_what_both_rank_middling() -> None:
    lexical = [*(f"l{n}" for n in range(9)), "both"]  # tenth for BM25
    semantic = ["meaning", *(f"s{n}" for n in range(48)), "both"]  # fiftieth for the vectors
    # Equal weights: in both lists, however low, beats first in one only.
    assert Fusion(k=60, semantic_weight=1.0).fuse(lexical, semantic)[0] == "both"
    # Weighted towards the vectors, their first hit comes first; a larger k flattens the top ranks' lead.
    assert Fusion(k=60, semantic_weight=2.0).fuse(lexical, semantic)[0] == "meaning"
    assert Fusion(k=1000, semantic_weight=2.0).fuse(lexical, semantic)[0] == "both"
    # The defaults weigh the vectors above BM25, and are the worker's settings' defaults.
    assert Fusion().fuse(lexical, semantic)[0] == "meaning"
    assert Fusion.of(WorkerSettings()) == Fusion()
    assert Fusion(lexical_weight=0.0).fuse(lexical, semantic)[:2] == ["meaning", "s0"]
    settings = WorkerSettings(corpus_fusion_k=10, corpus_fusion_semantic_weight=1.5, corpus_fusion_depth=30)
    assert Fusion.of(settings) == Fusion(k=10, lexical_weight=1.0, semantic_weight=1.5, depth=30)


async def test_web_results_are_reranked_by_meaning(embeddings: ScriptedModel) -> None:
    class Engine:
        def __init__(self) -> None:
            self.limits: list[int] = []

        async def search(self, query: str, limit: int) -> list[SearchResult]:
            self.limits.append(limit)
            return [
                SearchResult("Harbour cranes", "https://a.example/cranes", "Cranes on the quays"),
                SearchResult("Rail timetable", "https://a.example/rail", "Locomotives and wagons"),
                SearchResult("Ocean voyages", "https://a.example/ships", "A ship on a long voyage"),
            ]

    engine = Engine()
    reranked = RerankedSearch(engine, embedder_for(embeddings))
    results = await reranked.search("vessel crossings", 2)
    assert engine.limits == [4], "twice the results asked for are reranked"
    # Its own ranks: cranes, rail, ships; by meaning: ships, cranes, rail. Fused: cranes (1/61 + 1/62),
    # ships (1/63 + 1/61), rail (1/62 + 1/63).
    assert [r.url for r in results] == ["https://a.example/cranes", "https://a.example/ships"]
    embeddings.embedding_faults.append(HttpError(500))
    results = await reranked.search("vessel crossings", 2)
    assert [r.url for r in results] == ["https://a.example/cranes", "https://a.example/rail"]
    assert isinstance(results, SearchResults) and "search service's own order" in results.notice
