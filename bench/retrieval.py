"""Corpus retrieval benchmark: indexing time, query latency, recall, and what snippets cost.

    python3 bench/retrieval.py [--pages 600] [--questions 100] [--dimensions 384] [--rounds 3]

Writes `pages` synthetic manual pages (Markdown, about 7 KB each): each is about one
subject and one aspect of it ("Replica latency"), with cross-references to other
pages and the sentences every page of a manual shares. Each question names one page's
subject and aspect: directly, in the pages' own words; reworded, with one of the two
words replaced by another (standby for replica, delay for latency) that only the
embeddings know to be the same; and with both replaced. The scripted model server
(tests/fakes) answers /v1/embeddings with hashed bags of words in which those synonyms
count as the words they stand for: the embeddings are an oracle for this rewording.
  - Indexing: the pages into a BM25-only index and into a hybrid one (vectors from the
    scripted server over loopback HTTP), per 1,000 pages.
  - Queries: each question through `Corpus.retrieve` (5 hits) in both modes: latency
    p50/p99, and recall (the page asked about is first: R@1, in the five: R@5); and
    the vector ranking alone, for reference. Each runs `rounds` times, taking turns.
  - Snippets: the same BM25 queries as the search ran them before (every word of the
    question, FTS5 `snippet()` in the ranking query) and as it runs them now (common
    words left out, ranking, then snippets from the 5 hits' text only), each also as
    the ranking alone.
The embeddings cost what the scripted server costs (hashing words), not what a model
costs: the hybrid figures are Quarry's share plus one loopback HTTP request per query.
Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import arguments, percentile

from tests.fakes.openai_server import ScriptedModel
from worker_svc.corpus import Corpus, Embedder, EmbeddingSettings
from worker_svc.corpus.search import match_expression

# (the word the pages use, the word a reader may use instead)
SUBJECTS = [
    ("vacuum", "garbage"),
    ("checkpoint", "flushpoint"),
    ("replica", "standby"),
    ("tablespace", "volume"),
    ("trigger", "hook"),
    ("sequence", "counter"),
    ("cursor", "iterator"),
    ("schema", "namespace"),
    ("role", "account"),
    ("extension", "plugin"),
    ("partition", "shard"),
    ("tuple", "record"),
    ("lock", "mutex"),
    ("transaction", "txn"),
    ("planner", "optimizer"),
    ("collation", "ordering"),
    ("publication", "feed"),
    ("subscription", "follower"),
    ("aggregate", "rollup"),
    ("view", "projection"),
    ("autovacuum", "janitor"),
    ("wal", "journal"),
    ("buffer", "cache"),
    ("index", "lookup"),
    ("archive", "backup"),
    ("listener", "socket"),
    ("statistics", "metrics"),
    ("tokenizer", "lexer"),
    ("operator", "symbol"),
    ("domain", "subtype"),
]
ASPECTS = [
    ("size", "footprint"),
    ("timeout", "deadline"),
    ("memory", "ram"),
    ("limit", "ceiling"),
    ("priority", "precedence"),
    ("owner", "holder"),
    ("permission", "grant"),
    ("encoding", "charset"),
    ("latency", "delay"),
    ("throughput", "rate"),
    ("visibility", "exposure"),
    ("naming", "label"),
    ("logging", "tracing"),
    ("compression", "packing"),
    ("encryption", "cipher"),
    ("retention", "keeping"),
    ("startup", "boot"),
    ("shutdown", "teardown"),
    ("monitoring", "observation"),
    ("recovery", "restore"),
]
SYNONYMS = {reader: page for page, reader in SUBJECTS + ASPECTS}
# What every page of a manual says in some form: the words all pages share.
COMMON = [
    "Changes take effect after the configuration file is reloaded by the server process.",
    "Only a superuser can change this setting, unless the administrator grants it explicitly.",
    "The default is chosen to suit a small installation and should be raised on larger systems.",
    "See the release notes for behaviour that changed between major versions of the server.",
    "The value is read once at server start and cannot be changed in a running session.",
    "A warning is written to the server log when the configured value cannot be honoured.",
    "Setting the value too low can make the server slower, too high can exhaust the machine.",
    "The setting can also be given on the command line when the server is started.",
    "Existing sessions keep the old value until they reconnect to the server.",
    "The system views show the value currently in effect for every session.",
]
FOCUS = [
    "The {a} of a {s} is configured per database, and each {s} may override it.",
    "When the {s} {a} grows beyond what was planned, the server reports it in the log.",
    "Administrators tune {s} {a} first when the workload changes.",
    "A {s} keeps its {a} until it is altered or dropped.",
    "The {a} applies to every {s} created afterwards, not to existing ones.",
    "Monitoring the {a} of each {s} early avoids surprises later.",
]
MENTIONS = [
    "This differs from the {a} of a {s}, described in its own section.",
    "The {s} also has a {a}, which is independent of this one.",
]
DIRECT = ["How is the {a} of a {s} configured?", "What controls {s} {a}?", "Where do I set the {a} for a {s}?"]
PATH = "SELECT path FROM documents WHERE rowid = ?"


@dataclass(frozen=True)
class Question:
    text: str
    page: str  # corpus:// URL of the page that answers it


def write_pages(folder: Path, count: int, rng: random.Random) -> list[tuple[int, int]]:
    """`count` pages, each on its own (subject, aspect); returns those pairs by page number."""
    pairs = [(s, a) for s in range(len(SUBJECTS)) for a in range(len(ASPECTS))]
    rng.shuffle(pairs)
    if count > len(pairs):
        raise SystemExit(f"at most {len(pairs)} pages")
    folder.mkdir(parents=True)
    for number, (s, a) in enumerate(pairs[:count]):
        subject, aspect = SUBJECTS[s][0], ASPECTS[a][0]
        sentences: list[str] = []
        while sum(len(sentence) + 1 for sentence in sentences) < 7000:
            roll = rng.random()
            if roll < 0.3:
                sentences.append(rng.choice(FOCUS).format(s=subject, a=aspect))
            elif roll < 0.4:
                other_s, other_a = rng.choice(pairs)
                sentences.append(rng.choice(MENTIONS).format(s=SUBJECTS[other_s][0], a=ASPECTS[other_a][0]))
            else:
                sentences.append(rng.choice(COMMON))
        paragraphs = [" ".join(sentences[start : start + 6]) for start in range(0, len(sentences), 6)]
        body = "\n\n".join(paragraphs)
        (folder / f"page-{number:04d}.md").write_text(f"# {subject.title()} {aspect}\n\n{body}\n")
    return pairs[:count]


def questions_for(pairs: list[tuple[int, int]], count: int, rng: random.Random) -> dict[str, list[Question]]:
    """For `count` pages drawn at random, a question in each of three phrasings."""
    sets: dict[str, list[Question]] = {"direct": [], "reworded, one word": [], "reworded, both words": []}
    for number in rng.sample(range(len(pairs)), min(count, len(pairs))):
        (subject, subject_other), (aspect, aspect_other) = SUBJECTS[pairs[number][0]], ASPECTS[pairs[number][1]]
        url = f"corpus://pages/page-{number:04d}.md"
        template = rng.choice(DIRECT)
        one = (subject_other, aspect) if number % 2 else (subject, aspect_other)
        sets["direct"].append(Question(template.format(s=subject, a=aspect), url))
        sets["reworded, one word"].append(Question(template.format(s=one[0], a=one[1]), url))
        sets["reworded, both words"].append(Question(template.format(s=subject_other, a=aspect_other), url))
    return sets


def timed(run: Callable[[str], list[str]], questions: list[Question]) -> tuple[list[float], float, float]:
    """Latencies (ms) of each question, and R@1 and R@5."""
    latencies, first, five = [], 0, 0
    for question in questions:
        started = time.perf_counter()
        found = run(question.text)
        latencies.append((time.perf_counter() - started) * 1000)
        first += found[:1] == [question.page]
        five += question.page in found[:5]
    return latencies, first / len(questions), five / len(questions)


def search(corpus: Corpus) -> Callable[[str], list[str]]:
    return lambda text: [hit.result.url for hit in corpus.retrieve(text, 5).hits]


def vectors_alone(corpus: Corpus, embedder: Embedder) -> Callable[[str], list[str]]:
    """The vector ranking before fusion (the corpus's own internals): what the embeddings find by themselves."""

    def run(text: str) -> list[str]:
        with corpus._connect() as connection:
            docs = list(corpus._vectors.nearest(connection, embedder, text, 5))
            return [f"corpus://{connection.execute(PATH, (doc,)).fetchone()[0]}" for doc in docs]

    return run


def every_word(query: str) -> str:
    """The FTS5 expression the search used before: every word, common ones too."""
    return " OR ".join('"{}"'.format(word.replace('"', '""')) for word in query.split())


def fts5_query(index: Path, sql: str, expression: Callable[[str], str]) -> Callable[[str], list[str]]:
    """One BM25 query as raw SQL on the index, on one connection (the search opens one per query)."""
    connection = sqlite3.connect(index, check_same_thread=False)

    def run(text: str) -> list[str]:
        return [f"corpus://{row[0]}" for row in connection.execute(sql, (expression(text), 5))]

    return run


def row(label: str, latencies: list[float], recall: tuple[float, float] | None = None) -> str:
    figures = f"| {label} | {percentile(latencies, 0.5):.2f} | {percentile(latencies, 0.99):.2f} |"
    return figures + (f" {recall[0]:.2f} | {recall[1]:.2f} |" if recall else "")


async def main_async(args: argparse.Namespace) -> None:
    rng = random.Random(17)
    with tempfile.TemporaryDirectory() as workdir_name:
        workdir = Path(workdir_name)
        pairs = write_pages(workdir / "pages", args.pages, rng)
        questions = questions_for(pairs, args.questions, rng)
        async with ScriptedModel(synonyms=SYNONYMS, embedding_dimensions=args.dimensions) as server:
            embedder = Embedder(EmbeddingSettings(server.base_url, "bench-embedder", batch_size=args.batch))
            plain, hybrid = Corpus(workdir / "bm25.db"), Corpus(workdir / "hybrid.db", embedder)
            per_thousand = 1000 / args.pages
            for label, corpus in (("BM25 only", plain), ("BM25 + vectors", hybrid)):
                started = time.perf_counter()
                report = await asyncio.to_thread(corpus.index_folder, workdir / "pages")
                elapsed = time.perf_counter() - started
                passages = sum(len(request["input"]) for request in server.embedding_requests)
                print(
                    f"indexing, {label}: {elapsed:.2f} s for {len(report.added)} pages = "
                    f"{elapsed * per_thousand:.2f} s per 1,000 pages"
                    + (f" ({passages} passages, {len(server.embedding_requests)} requests)" if report.embedded else "")
                )
            await asyncio.to_thread(search(hybrid), "warm up")  # reads the vectors into memory
            print(f"\n{args.questions} pages asked about, in three phrasings; 5 hits each:\n")
            print("| search | questions | p50 ms | p99 ms | R@1 | R@5 |")
            print("| --- | --- | ---: | ---: | ---: | ---: |")
            searches = {
                "BM25 only": search(plain),
                "hybrid (RRF)": search(hybrid),
                "vectors alone (reference)": vectors_alone(hybrid, embedder),
            }
            latencies: dict[tuple[str, str], list[float]] = {}
            recall: dict[tuple[str, str], tuple[float, float]] = {}
            for _ in range(args.rounds):  # the searches take turns, so that the machine's drift hits all alike
                for label, run in searches.items():
                    for kind, asked in questions.items():
                        times, at_1, at_5 = await asyncio.to_thread(timed, run, asked)
                        latencies.setdefault((label, kind), []).extend(times)
                        recall[label, kind] = (at_1, at_5)
            for label, kind in latencies:
                print(row(f"{label} | {kind}", latencies[label, kind], recall[label, kind]))
            everything = [question for asked in questions.values() for question in asked]
            before = "SELECT path, title, snippet(documents, 2, '', '', ' … ', 24) FROM documents"
            ranked = "SELECT path FROM documents"
            clause = " WHERE documents MATCH ? ORDER BY bm25(documents) LIMIT ?"
            print(f"\nsnippets, the {len(everything)} questions, BM25 only:\n")
            print("| query | p50 ms | p99 ms |")
            print("| --- | ---: | ---: |")
            index = workdir / "bm25.db"
            queries = {
                "before: every word, FTS5 snippet() in the ranking query": fts5_query(
                    index, before + clause, every_word
                ),
                "before, ranking alone": fts5_query(index, ranked + clause, every_word),
                "now: common words left out, ranking, then snippets of the 5 hits (`Corpus.retrieve`)": search(plain),
                "now, ranking alone": fts5_query(index, ranked + clause, match_expression),
            }
            snippet_latencies: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                for label, run in queries.items():
                    times, _, _ = await asyncio.to_thread(timed, run, everything)
                    snippet_latencies.setdefault(label, []).extend(times)
            for label, times in snippet_latencies.items():
                print(row(label, times))
            embedder.close()


def main() -> None:
    asyncio.run(main_async(arguments(__doc__, pages=600, questions=100, dimensions=384, batch=64, rounds=3)))


if __name__ == "__main__":
    main()
