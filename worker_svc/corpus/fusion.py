"""Rank fusion: rankings from different scorers (BM25, vectors, a search engine's own order) fused by
reciprocal rank, since their scores are not comparable but their ranks are; and web results reranked so."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from quarry.config import WorkerSettings
from worker_svc.corpus.embeddings import Embedder, EmbeddingError
from worker_svc.web.search import SearchBackend, SearchResult, SearchResults

log = logging.getLogger(__name__)

# Reciprocal rank fusion's constant (Cormack et al. 2009): the first ranks of each list count
# most, and no list's top result outweighs agreement between lists.
RRF_K = 60
# Web results fetched for a rerank, at most: a reranked page of results draws on twice as many.
RERANK_POOL = 20

# How deep each of the corpus's rankings goes before fusion: a page the vectors rank well but BM25 ranks
# outside this depth (or not at all) is still a candidate.
FUSION_DEPTH = 100
# The corpus's defaults, chosen by bench/retrieval.py's sweep on its development questions (a real manual,
# a real embedding model) and checked on its held-out ones (docs/benchmarks.md): the vectors' ranking
# weighs three times BM25's, and a smaller k than RRF's usual 60 keeps the top ranks' lead.
CORPUS_FUSION_K = 30
CORPUS_SEMANTIC_WEIGHT = 3.0

Item = TypeVar("Item", bound=Hashable)


@dataclass(frozen=True)
class Fusion:
    """How the corpus fuses BM25's ranking with the vectors': weighted reciprocal rank fusion over the top
    `depth` of each (settings `QUARRY_WORKER_CORPUS_FUSION_*`)."""

    k: int = CORPUS_FUSION_K
    lexical_weight: float = 1.0
    semantic_weight: float = CORPUS_SEMANTIC_WEIGHT
    depth: int = FUSION_DEPTH

    @classmethod
    def of(cls, settings: WorkerSettings) -> Fusion:
        return cls(
            settings.corpus_fusion_k,
            settings.corpus_fusion_lexical_weight,
            settings.corpus_fusion_semantic_weight,
            settings.corpus_fusion_depth,
        )

    def fuse(self, lexical: Sequence[Item], semantic: Sequence[Item]) -> list[Item]:
        return reciprocal_rank_fusion([lexical, semantic], self.k, (self.lexical_weight, self.semantic_weight))


DEFAULT_FUSION = Fusion()


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Item]], k: int = RRF_K, weights: Sequence[float] | None = None
) -> list[Item]:
    """Every item of the rankings (each best first), by the sum of weight / (k + rank) over the rankings holding
    it (each ranking's weight 1 unless given).

    Ties keep the order in which the items were first seen, the first ranking's first.
    """
    scores: dict[Item, float] = {}
    for index, ranking in enumerate(rankings):
        weight = 1.0 if weights is None else weights[index]
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    return sorted(scores, key=lambda item: -scores[item])


class RerankedSearch:
    """A search backend whose results are reordered by meaning too: its own ranks fused with the ranks of
    each result's similarity (title and snippet) to the query. Without the embeddings, its own order."""

    def __init__(self, backend: SearchBackend, embedder: Embedder) -> None:
        self._backend = backend
        self._embedder = embedder

    async def search(self, query: str, limit: int) -> list[SearchResult]:
        results = await self._backend.search(query, max(limit, min(2 * limit, RERANK_POOL)))
        if len(results) < 2:
            return results
        texts = [query, *(f"{result.title}\n{result.snippet}" for result in results)]
        try:
            vectors = await asyncio.to_thread(self._embedder.embed, texts)
        except EmbeddingError as error:
            log.warning("web search results not reranked: %s", error)
            return SearchResults(results[:limit], notice=f"Results in the search service's own order: {error}.")
        similarity = vectors[1:] @ vectors[0]
        by_meaning = sorted(range(len(results)), key=lambda index: -float(similarity[index]))
        order = reciprocal_rank_fusion([list(range(len(results))), by_meaning])
        return [results[index] for index in order[:limit]]
