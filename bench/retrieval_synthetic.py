"""Corpus retrieval on synthetic pages and oracle embeddings: indexing time, query latency, recall, snippets.

    python3 bench/retrieval_synthetic.py [--pages 600] [--questions 100] [--dimensions 384] [--batch 64] [--rounds 5]

Writes `pages` synthetic manual pages (Markdown, about 7 KB each): each is about one
subject and one aspect of it ("Replica latency"), with cross-references to other
pages and the sentences every page of a manual shares. Each question names one page's
subject and aspect: directly, in the pages' own words; reworded, with one of the two
words replaced by another (standby for replica, delay for latency) that only the
embeddings know to be the same; and with both replaced. The scripted model server
(tests/fakes) answers /v1/embeddings with hashed bags of words in which those synonyms
count as the words they stand for: the embeddings are an oracle for this rewording.
  - Indexing: the pages into a fresh BM25-only index and a fresh hybrid one (vectors from
    the scripted server over loopback HTTP, `batch` passages a request), per 1,000 pages.
  - Queries: each question through `Corpus.retrieve` (5 hits) in both modes: latency
    p50/p99, and recall (the page asked about is first: R@1, in the five: R@5); and
    the vector ranking alone, for reference. Recall is deterministic; it is still
    reported per round, as a check that every round searched alike.
  - Snippets: the same BM25 queries as the search ran them before (every word of the
    question, FTS5 `snippet()` in the ranking query) and as it runs them now (common
    words left out, ranking, then snippets from the 5 hits' text only), each also as
    the ranking alone.
Each of `rounds` rounds (bench/rounds.py) builds both indexes, then runs every search
and every snippet query over that round's indexes, in an order that rotates between
rounds; ratios (hybrid / BM25, before / now) are taken within a round.
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
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path

from harness import arguments, percentile
from rounds import MIN_ROUNDS, Rounds

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


def fts5_query(
    connection: sqlite3.Connection, sql: str, expression: Callable[[str], str]
) -> Callable[[str], list[str]]:
    """One BM25 query as raw SQL on the index, on one connection (the search opens one per query)."""

    def run(text: str) -> list[str]:
        return [f"corpus://{row[0]}" for row in connection.execute(sql, (expression(text), 5))]

    return run


SEARCHES = ("BM25 only", "hybrid (RRF)", "vectors alone (reference)")
SNIPPETS = (
    "before: snippet() in the ranking query",
    "before: ranking alone",
    "now: ranking, then snippets (Corpus.retrieve)",
    "now: ranking alone",
)
SELECT_SNIPPETS = "SELECT path, title, snippet(documents, 2, '', '', ' … ', 24) FROM documents"
SELECT_RANKED = "SELECT path FROM documents"
RANKING = " WHERE documents MATCH ? ORDER BY bm25(documents) LIMIT ?"


async def index_both(
    rounds: Rounds, index: int, pages: Path, workdir: Path, server: ScriptedModel, embedder: Embedder
) -> tuple[Corpus, Corpus]:
    """This round's fresh indexes, BM25 only and hybrid, built in turn; their time per 1,000 pages recorded."""
    corpora = {
        "BM25 only": Corpus(workdir / f"bm25-{index}.db"),
        "hybrid": Corpus(workdir / f"hybrid-{index}.db", embedder),
    }
    for label in rounds.order(list(corpora), index):
        server.embedding_requests.clear()
        started = time.perf_counter()
        report = await asyncio.to_thread(corpora[label].index_folder, pages)
        elapsed = time.perf_counter() - started
        rounds.record(f"indexing, {label}", elapsed * 1000 / len(report.added), "s per 1,000 pages")
        if report.embedded:
            rounds.record("passages embedded", sum(len(request["input"]) for request in server.embedding_requests))
            rounds.record("embedding requests", len(server.embedding_requests))
    return corpora["BM25 only"], corpora["hybrid"]


async def search_round(
    rounds: Rounds, index: int, searches: dict[str, Callable[[str], list[str]]], questions: dict[str, list[Question]]
) -> None:
    for label in rounds.order(list(searches), index):
        for kind, asked in questions.items():
            times, at_1, at_5 = await asyncio.to_thread(timed, searches[label], asked)
            rounds.record(f"{label} [{kind}] p50", percentile(times, 0.5), "ms")
            rounds.record(f"{label} [{kind}] p99", percentile(times, 0.99), "ms")
            rounds.record(f"{label} [{kind}] R@1", at_1)
            rounds.record(f"{label} [{kind}] R@5", at_5)


async def snippet_round(rounds: Rounds, index: int, plain: Corpus, database: Path, everything: list[Question]) -> None:
    with ExitStack() as stack:

        def query(sql: str, expression: Callable[[str], str]) -> Callable[[str], list[str]]:
            connection = stack.enter_context(closing(sqlite3.connect(database, check_same_thread=False)))
            return fts5_query(connection, sql, expression)

        queries = dict(
            zip(
                SNIPPETS,
                (
                    query(SELECT_SNIPPETS + RANKING, every_word),
                    query(SELECT_RANKED + RANKING, every_word),
                    search(plain),
                    query(SELECT_RANKED + RANKING, match_expression),
                ),
                strict=True,
            )
        )
        for label in rounds.order(list(queries), index):
            times, _, _ = await asyncio.to_thread(timed, queries[label], everything)
            rounds.record(f"snippets, {label} p50", percentile(times, 0.5), "ms")
            rounds.record(f"snippets, {label} p99", percentile(times, 0.99), "ms")


async def main_async(args: argparse.Namespace) -> None:
    rng = random.Random(17)
    rounds = Rounds("retrieval_synthetic", args.rounds)
    with tempfile.TemporaryDirectory() as workdir_name:
        workdir = Path(workdir_name)
        pairs = write_pages(workdir / "pages", args.pages, rng)
        questions = questions_for(pairs, args.questions, rng)
        everything = [question for asked in questions.values() for question in asked]
        async with ScriptedModel(synonyms=SYNONYMS, embedding_dimensions=args.dimensions) as server:
            embedder = Embedder(EmbeddingSettings(server.base_url, "bench-embedder", batch_size=args.batch))
            for index in rounds:
                plain, hybrid = await index_both(rounds, index, workdir / "pages", workdir, server, embedder)
                await asyncio.to_thread(search(hybrid), "warm up")  # reads the vectors into memory
                searches = dict(
                    zip(SEARCHES, (search(plain), search(hybrid), vectors_alone(hybrid, embedder)), strict=True)
                )
                await search_round(rounds, index, searches, questions)
                await snippet_round(rounds, index, plain, workdir / f"bm25-{index}.db", everything)
            embedder.close()
    rounds.ratio("indexing, hybrid / BM25 only", "indexing, hybrid", "indexing, BM25 only")
    for kind in questions:
        rounds.ratio(f"hybrid / BM25 only [{kind}] p50", f"hybrid (RRF) [{kind}] p50", f"BM25 only [{kind}] p50")
    rounds.ratio("snippets, before / now p50", f"snippets, {SNIPPETS[0]} p50", f"snippets, {SNIPPETS[2]} p50")
    rounds.ratio("ranking alone, before / now p50", f"snippets, {SNIPPETS[1]} p50", f"snippets, {SNIPPETS[3]} p50")
    print(
        f"{args.pages} pages; {len(everything)} questions ({args.questions} pages asked about, in three phrasings), "
        "5 hits each; the snippet queries over all of them, BM25 only"
    )
    rounds.report()


def main() -> None:
    asyncio.run(main_async(arguments(__doc__, pages=600, questions=100, dimensions=384, batch=64, rounds=MIN_ROUNDS)))


if __name__ == "__main__":
    main()
