"""Corpus retrieval on a real manual with a real embedding model: recall, the fusion's constants, latency, indexing.

    python3 bench/retrieval.py [--corpus /usr/share/doc/postgresql-doc-15/html]
        [--questions bench/questions/postgresql-15.toml] [--rounds 5]

The corpus is the PostgreSQL 15 manual as Debian's postgresql-doc-15 package ships it (1,173 HTML
pages; `apt-get install postgresql-doc-15`). The questions file names, for each question, the page or
pages that answer it: "reworded" questions avoid the pages' own words, "own words" questions use them,
and within each kind they alternate between a development set and a held-out set. The embeddings come
from bench/embeddings_server.py, a real small model (WordLlama, 256 dimensions) whose weights ship in
its PyPI package, behind /v1/embeddings on a loopback port, started as a process here.

Each round (bench/rounds.py; the order of the contenders rotates):
  - indexes the corpus afresh, BM25 only: seconds, and size on disk;
  - the embedding pass: a copy of a BM25 index of the corpus (made before the rounds) indexed again with
    the embedder, which embeds every document and changes nothing else: seconds, and size on disk. A
    fresh hybrid index costs the two together;
  - the model alone: every passage the embedding pass embeds, sent straight to the server in the same
    batches and with the same concurrency, without Quarry. "embedding pass / model alone" is what
    Quarry's embedding costs beside the model's own time (1.0 would be nothing);
  - asks every question through the three searches (BM25 alone, the embeddings alone, hybrid with the
    fusion the worker's settings default to): latency p50 and p95.
Recall is deterministic and computed once: R@1, R@5 and MRR (over the first 10; a hit is any of the
question's pages) per search and question set. Then the fusion sweep: weighted reciprocal rank fusion
over the constant k and the embeddings' weight beside BM25's (1), ranked on the development set by
R@5 + MRR; the best is shown on the held-out set beside the default.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from harness import arguments, percentile
from rounds import MIN_ROUNDS, Rounds

from quarry.config import WorkerSettings
from worker_svc.corpus import Corpus, Embedder, EmbeddingSettings
from worker_svc.corpus.fusion import Fusion
from worker_svc.corpus.search import match_expression
from worker_svc.corpus.text import PassageSize, passages

BENCH = Path(__file__).resolve().parent
CORPUS = Path("/usr/share/doc/postgresql-doc-15/html")
QUESTIONS = BENCH / "questions" / "postgresql-15.toml"
DEPTH = 100  # of each ranking, as the search fuses them
TOP = 10  # MRR counts a hit this deep at most
KS = (2, 5, 10, 20, 30, 60, 100)
SEMANTIC_WEIGHTS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


@dataclass(frozen=True)
class Question:
    text: str
    pages: frozenset[str]  # file names in the corpus folder
    kind: str  # "reworded" or "own words"
    held_out: bool


@dataclass(frozen=True)
class Rankings:
    """One question's two rankings, page file names best first, as deep as the search fuses them."""

    lexical: list[str]
    semantic: list[str]


def load_questions(path: Path, corpus: Path) -> list[Question]:
    entries = tomllib.loads(path.read_text())["question"]
    seen: dict[str, int] = {}
    questions = []
    for entry in entries:
        missing = [page for page in entry["pages"] if not (corpus / page).is_file()]
        if missing:
            raise SystemExit(f"{path}: {entry['text']!r} names pages the corpus lacks: {missing}")
        order = seen[entry["kind"]] = seen.get(entry["kind"], -1) + 1
        questions.append(Question(entry["text"], frozenset(entry["pages"]), entry["kind"], order % 2 == 1))
    return questions


def question_sets(questions: list[Question]) -> dict[str, list[Question]]:
    sets: dict[str, list[Question]] = {}
    for question in questions:
        sets.setdefault(question.kind, []).append(question)
        sets.setdefault(f"{question.kind}, {'held-out' if question.held_out else 'development'}", []).append(question)
    return sets


def recall(found: list[list[str]], questions: list[Question]) -> tuple[float, float, float]:
    """R@1, R@5 and MRR of the rankings found for the questions."""
    at_1 = at_5 = reciprocal = 0.0
    for ranking, question in zip(found, questions, strict=True):
        rank = next((at for at, page in enumerate(ranking[:TOP], 1) if page in question.pages), None)
        at_1 += rank == 1
        at_5 += rank is not None and rank <= 5
        reciprocal += 1 / rank if rank else 0.0
    return at_1 / len(questions), at_5 / len(questions), reciprocal / len(questions)


@contextmanager
def embeddings_server() -> Iterator[str]:
    """bench/embeddings_server.py as a process; its base URL."""
    process = subprocess.Popen([sys.executable, str(BENCH / "embeddings_server.py")], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            raise SystemExit(f"the embeddings server did not start: {line!r}")
        yield line.removeprefix("listening on ").strip()
    finally:
        process.terminate()
        process.wait(timeout=10)


def page(connection_path: str) -> str:
    return Path(connection_path).name


def rankings(corpus: Corpus, embedder: Embedder, question: Question) -> Rankings:
    """The question's BM25 and vector rankings, as deep as the search fuses them (the corpus's internals)."""
    with corpus._connect() as connection:
        names = dict(connection.execute("SELECT rowid, path FROM documents"))
        lexical = [
            page(names[doc])
            for (doc,) in connection.execute(
                "SELECT rowid FROM documents WHERE documents MATCH ? ORDER BY rank LIMIT ?",
                (match_expression(question.text), DEPTH),
            )
        ]
        semantic = [page(names[doc]) for doc in corpus._vectors.nearest(connection, embedder, question.text, DEPTH)]
    return Rankings(lexical, semantic)


def passage_texts(corpus: Corpus, settings: EmbeddingSettings) -> list[str]:
    """Every passage the index's documents are embedded as."""
    size = PassageSize(settings.passage_tokens, settings.passage_overlap_tokens)
    with corpus._connect() as connection:
        return [
            piece
            for title, text in connection.execute("SELECT title, text FROM documents")
            for _, piece in passages(title, text, size)
        ]


def model_alone(base_url: str, texts: list[str], settings: EmbeddingSettings) -> float:
    """Seconds the server takes to embed the texts, in the indexing's batches and concurrency."""
    batches = [texts[at : at + settings.batch_size] for at in range(0, len(texts), settings.batch_size)]
    with httpx.Client(base_url=base_url, timeout=120) as client, ThreadPoolExecutor(settings.concurrency) as pool:

        def embed(batch: list[str]) -> None:
            response = client.post("/embeddings", json={"model": "m", "input": batch, "encoding_format": "float"})
            response.raise_for_status()

        started = time.perf_counter()
        list(pool.map(embed, batches))
        return time.perf_counter() - started


def latencies(run: Callable[[str], object], questions: list[Question]) -> list[float]:
    times = []
    for question in questions:
        started = time.perf_counter()
        run(question.text)
        times.append((time.perf_counter() - started) * 1000)
    return times


def size_mib(path: Path) -> float:
    return sum(file.stat().st_size for file in path.parent.glob(path.name + "*")) / 2**20


# Reciprocal rank fusion's usual constants (Cormack et al.), the corpus's default before this bench chose one.
USUAL = Fusion(60, 1.0, 1.0, DEPTH)


def sweep(found: list[Rankings], questions: list[Question], default: Fusion) -> None:
    """Weighted RRF over KS x SEMANTIC_WEIGHTS, best on the development questions (R@5 + MRR) first; the
    held-out figures beside, and R@5 on each set of reworded questions; then the default and the usual pair."""
    development = [index for index, question in enumerate(questions) if not question.held_out]
    held_out = [index for index, question in enumerate(questions) if question.held_out]
    reworded = {
        held: [index for index in (held_out if held else development) if questions[index].kind == "reworded"]
        for held in (False, True)
    }

    def scores(fusion: Fusion, indexes: list[int]) -> tuple[float, float, float]:
        fused = [fusion.fuse(found[index].lexical, found[index].semantic) for index in indexes]
        return recall(fused, [questions[index] for index in indexes])

    candidates = [Fusion(k, 1.0, weight, DEPTH) for k in KS for weight in SEMANTIC_WEIGHTS]
    ranked = sorted(candidates, key=lambda fusion: sum(scores(fusion, development)[1:]), reverse=True)
    print(f"\nFusion sweep: weighted RRF, BM25's weight 1; {len(development)} development, {len(held_out)} held-out")
    columns = ("dev R@1", "dev R@5", "dev MRR", "held R@1", "held R@5", "held MRR", "rw dev R@5", "rw held R@5")
    print(f"{'k':>4} {'embeddings':>10}  " + " ".join(f"{column:>11}" for column in columns))
    for fusion in [*ranked[:8], default, USUAL]:
        dev, held = scores(fusion, development), scores(fusion, held_out)
        worded = (scores(fusion, reworded[False])[1], scores(fusion, reworded[True])[1])
        label = "  (the default)" if fusion == default else "  (RRF's usual constants)" if fusion == USUAL else ""
        figures = " ".join(f"{value:>11.2f}" for value in (*dev, *held, *worded))
        print(f"{fusion.k:>4} {fusion.semantic_weight:>10.2f}  {figures}{label}")


def index_round(
    rounds: Rounds, index: int, folder: Path, workdir: Path, base_url: str, texts: list[str], hybrid: Corpus
) -> Corpus:
    """This round's indexes in rotating order: a fresh BM25 one; the hybrid one, a copy of the BM25 index made
    before the rounds given its vectors (the embedding pass alone: every document unchanged, none embedded);
    and the model alone. Returns the BM25 index."""
    plain = Corpus(workdir / f"bm25-{index}.db")
    shutil.copy(workdir / "passages.db", hybrid.index_path)
    timings: dict[str, float] = {}
    for label in rounds.order(["BM25 only", "embedding pass", "model alone"], index):
        started = time.perf_counter()
        if label == "model alone":
            assert hybrid.embedder is not None
            timings[label] = model_alone(base_url, texts, hybrid.embedder.settings)
            rounds.record(label, timings[label], "s")
            continue
        corpus = plain if label == "BM25 only" else hybrid
        report = corpus.index_folder(folder)
        timings[label] = time.perf_counter() - started
        rounds.record("indexing, BM25 only" if label == "BM25 only" else label, timings[label], "s")
        rounds.record(
            f"index size, {'BM25 only' if label == 'BM25 only' else 'hybrid'}", size_mib(corpus.index_path), "MiB"
        )
        if report.embedded:
            rounds.record("pages embedded", report.embedded)
            rounds.record("share of the text embedded", report.embedded_share)
    rounds.record("embedding pass / model alone", timings["embedding pass"] / timings["model alone"], "x")
    return plain


def search_round(
    rounds: Rounds, index: int, searches: dict[str, Callable[[str], object]], asked: list[Question]
) -> None:
    for label in rounds.order(list(searches), index):
        times = latencies(searches[label], asked)
        rounds.record(f"{label} p50", percentile(times, 0.5), "ms")
        rounds.record(f"{label} p95", percentile(times, 0.95), "ms")


def record_recall(rounds: Rounds, found: list[Rankings], questions: list[Question], fusion: Fusion) -> None:
    """R@1, R@5 and MRR of each search on each question set (deterministic: the same in every round)."""
    for name, asked in question_sets(questions).items():
        picked = [found[questions.index(question)] for question in asked]
        searches = {
            "BM25 only": [ranks.lexical for ranks in picked],
            "embeddings alone": [ranks.semantic for ranks in picked],
            "hybrid": [fusion.fuse(ranks.lexical, ranks.semantic) for ranks in picked],
        }
        for label, ranked in searches.items():
            for figure, value in zip(("R@1", "R@5", "MRR"), recall(ranked, asked), strict=True):
                rounds.values[f"{label} [{name}] {figure}"] = [value] * rounds.count


def run(args: argparse.Namespace) -> None:
    folder = Path(args.corpus)
    if not folder.is_dir():
        raise SystemExit(f"{folder} is missing: apt-get install postgresql-doc-15 (or give --corpus)")
    questions = load_questions(Path(args.questions), folder)
    default = Fusion.of(WorkerSettings())
    rounds = Rounds("retrieval", args.rounds)
    found: list[Rankings] = []
    with tempfile.TemporaryDirectory() as workdir_name, embeddings_server() as base_url:
        workdir = Path(workdir_name)
        settings = EmbeddingSettings(base_url, "wordllama-l2-supercat-256")
        embedder = Embedder(settings)
        first = Corpus(workdir / "passages.db")
        first.index_folder(folder)
        texts = passage_texts(first, settings)
        try:
            for index in rounds:
                hybrid = Corpus(workdir / f"hybrid-{index}.db", embedder, default)
                plain = index_round(rounds, index, folder, workdir, base_url, texts, hybrid)
                hybrid.retrieve("warm up", 5)  # reads the vectors into memory

                def alone(text: str, corpus: Corpus = hybrid) -> object:
                    with corpus._connect() as connection:
                        return corpus._vectors.nearest(connection, embedder, text, 5)

                searches: dict[str, Callable[[str], object]] = {
                    "BM25 only": lambda text, corpus=plain: corpus.retrieve(text, 5),
                    "embeddings alone": alone,
                    "hybrid": lambda text, corpus=hybrid: corpus.retrieve(text, 5),
                }
                search_round(rounds, index, searches, questions)
                found = found or [rankings(hybrid, embedder, question) for question in questions]
                for database in [*workdir.glob("bm25-*"), *workdir.glob("hybrid-*")]:
                    database.unlink()
            stats = httpx.get(base_url.removesuffix("/v1") + "/stats").json()
        finally:
            embedder.close()
    record_recall(rounds, found, questions, default)
    rounds.ratio("embedding pass / BM25 indexing", "embedding pass", "indexing, BM25 only")
    rounds.ratio("hybrid / BM25 only p50", "hybrid p50", "BM25 only p50")
    sets = ", ".join(f"{len(asked)} {name}" for name, asked in question_sets(questions).items())
    print(
        f"{folder}; {len(questions)} questions ({sets}); {len(texts):,} passages; fusion {default}; "
        f"tokens the model's window cut: {stats['cut']:,} of {stats['tokens']:,}; {os.cpu_count()} CPUs"
    )
    rounds.report()
    sweep(found, questions, default)


def main() -> None:
    run(arguments(__doc__, corpus=str(CORPUS), questions=str(QUESTIONS), rounds=MIN_ROUNDS))


if __name__ == "__main__":
    main()
