"""The local document corpus: folders of Markdown, HTML, text and PDF, indexed with SQLite FTS5.

Each indexed folder is a root with a name (its folder's name, made unique), and its documents
are cited as `corpus://<root name>/<path relative to the folder>`, read from the index by the
same page tools as the web, so local and web sources are verified the same way. With an
embedder, each document's passages also get vectors, stored in the same file, and search fuses
the BM25 ranking with the vectors'.

- `schema`: the index file, its schema and the upgrades from older ones.
- `text`: titles, passages, hashes and snippets, from a document's text.
- `indexing`: roots, indexed incrementally, listed and removed.
- `embeddings`: texts to vectors through the model endpoint.
- `vectors`: the index's passage vectors, written and searched.
- `fusion`: reciprocal rank fusion, and web results reranked by meaning.
- `search`: BM25 and vectors fused, snippets, and reading a document.
- `corpus`: the `Corpus`, one index file and what is asked of it.
"""

from worker_svc.corpus.corpus import Corpus
from worker_svc.corpus.embeddings import Embedder, EmbeddingError, EmbeddingSettings, Vectors
from worker_svc.corpus.fusion import RerankedSearch, reciprocal_rank_fusion
from worker_svc.corpus.indexing import IndexReport, Root
from worker_svc.corpus.schema import LEGACY_ROOT, SCHEMA_VERSION, SCHEME, CorpusError
from worker_svc.corpus.search import Hit, Retrieval
from worker_svc.corpus.vectors import EmbeddingStatus

__all__ = [
    "LEGACY_ROOT",
    "SCHEMA_VERSION",
    "SCHEME",
    "Corpus",
    "CorpusError",
    "Embedder",
    "EmbeddingError",
    "EmbeddingSettings",
    "EmbeddingStatus",
    "Hit",
    "IndexReport",
    "RerankedSearch",
    "Retrieval",
    "Root",
    "Vectors",
    "reciprocal_rank_fusion",
]
