"""`quarry corpus index|list|remove|search`: the local corpus's folders, and its search tried by hand.

The worker's own code, run in the command's process against the index file: the command line reaches it
through the registry's lazy "module:attribute" string (quarry/cli/registry.py), never by an import.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from quarry.config import QuarrySettings, WorkerSettings
from worker_svc.corpus import Corpus, CorpusError, Embedder, EmbeddingSettings, IndexReport, Retrieval, Root
from worker_svc.corpus.fusion import Fusion


def _when(root: Root) -> str:
    if root.indexed_at is None:
        return "before folders were recorded"
    return datetime.fromtimestamp(root.indexed_at).isoformat(sep=" ", timespec="seconds")


def _where(root: Root) -> str:
    if root.folder is None:
        return "(folder not recorded)"
    return str(root.folder) + ("" if root.folder.is_dir() else " (missing)")


def _print_report(report: IndexReport, folder: Path, index: Path) -> None:
    print(
        f"{folder} as corpus://{report.root}/ in {index}: {len(report.added)} added, {len(report.updated)} updated, "
        f"{len(report.removed)} removed, {report.unchanged} unchanged, {len(report.skipped)} skipped"
    )
    for path, why in report.skipped:
        print(f"  skipped {path}: {why}")
    if report.ignored:
        kinds = ", ".join(f"{count} {extension}" for extension, count in sorted(report.ignored.items()))
        print(f"  not Markdown, HTML, text or PDF, so not indexed: {kinds}")
    if not (report.added or report.updated or report.unchanged or report.skipped):
        print(
            f"  {folder} holds no Markdown (.md), HTML (.html), text (.txt) or PDF (.pdf) file, in it or below:"
            " add some and index it again"
        )


@contextmanager
def _progress_bar() -> Iterator[Callable[[int, int], None]]:
    """A progress(done, total) that shows a bar on stderr from its first call; gone once done."""
    with Progress(
        TextColumn("embedding documents"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = None

        def progress(done: int, total: int) -> None:
            nonlocal task
            if task is None:
                task = bar.add_task("embedding", total=total)
            bar.update(task, completed=done)

        yield progress


def _print_vectors(corpus: Corpus, report: IndexReport) -> None:
    if corpus.embedder is not None:
        model = corpus.embedder.settings.model
        size = corpus.embedder.settings
        print(
            f"  {report.embedded} documents embedded with {model}, {report.embedded_share:.0%} of their text, in"
            f" passages of at most {size.passage_tokens} tokens overlapping by {size.passage_overlap_tokens}"
            if report.embedded
            else f"  vectors: {model}, up to date"
        )
        if report.reembedded:
            print(f"  every document embedded again: {report.reembedded}")
        return
    status = corpus.embedding_status()
    if status.model is not None and status.embedded < status.documents:
        print(
            f"  {status.documents - status.embedded} of {status.documents} documents have no vectors from"
            f" {status.model}, which hybrid search uses: set QUARRY_WORKER_EMBEDDING_MODEL and index again"
        )


def _index(corpus: Corpus, folder: Path, reembed: bool) -> int:
    with _progress_bar() as progress:
        report = corpus.index_folder(folder, reembed=reembed, progress=progress)
    _print_report(report, folder.resolve(), corpus.index_path)
    _print_vectors(corpus, report)
    for root in corpus.roots():
        if root.folder is None:
            print(
                f"  the index still holds {root.documents} documents indexed before folders were recorded;"
                f" once their folder is indexed again, `quarry corpus remove {root.name}` drops them"
            )
    if report.not_embedded:
        print(f"  {len(report.not_embedded)} documents got no vectors; `quarry corpus index` again retries them:")
        for url, why in report.not_embedded[:20]:
            print(f"    {url}: {why}")
        return 1
    return 0


def _list(corpus: Corpus) -> int:
    roots = corpus.roots()
    if not roots:
        print(f"{corpus.index_path}: no folders indexed; add one with `quarry corpus index FOLDER`")
        return 0
    width = max(len(root.name) for root in roots)
    for root in roots:
        print(f"{root.name:<{width}}  {root.documents:>6} documents  indexed {_when(root)}  {_where(root)}")
    status = corpus.embedding_status()
    if status.model is None:
        print("vectors: none (search is BM25 alone)")
    else:
        print(
            f"vectors: {status.model}, {status.dimensions} dimensions,"
            f" for {status.embedded} of {status.documents} documents"
        )
    return 0


def _remove(corpus: Corpus, which: str) -> int:
    root = corpus.remove_root(which)
    print(f"removed {root.name} ({_where(root)}) and its {root.documents} documents from {corpus.index_path}")
    return 0


def _mode(corpus: Corpus, retrieval: Retrieval) -> str:
    if retrieval.mode == "hybrid":
        assert corpus.embedder is not None
        return f"hybrid search: BM25 fused with {corpus.embedder.settings.model} embeddings"
    if corpus.embedder is None:
        return "BM25 search (no embedding model configured)"
    return f"BM25 search alone: {retrieval.notice}"


def _search(corpus: Corpus, query: str, limit: int) -> int:
    retrieval = corpus.retrieve(query, limit)
    print(_mode(corpus, retrieval))
    hits = retrieval.hits
    if not hits:
        print(f"no document in {corpus.index_path} matches {query!r}", file=sys.stderr)
        return 1
    for rank, hit in enumerate(hits, start=1):
        print(f"{rank}. {hit.result.title}")
        print(f"   {hit.result.url}" + (f"  ({hit.file})" if hit.file else ""))
        for line in hit.result.snippet.splitlines():  # one line, or a table's rows one per line
            print(f"   {' '.join(line.split())}")
    return 0


def run(args: argparse.Namespace, index: Path, settings: WorkerSettings, common: QuarrySettings) -> int:
    """One `quarry corpus` command against the index file; with the worker's embedding model configured,
    indexing computes vectors and search is hybrid."""
    embedding = EmbeddingSettings.for_worker(settings, common)
    embedder = None if embedding is None else Embedder(embedding)
    corpus = Corpus(index, embedder, Fusion.of(settings))
    try:
        if args.corpus_command == "index":
            return _index(corpus, args.folder, args.reembed)
        if args.corpus_command == "list":
            return _list(corpus)
        if args.corpus_command == "remove":
            return _remove(corpus, args.root)
        return _search(corpus, args.query, args.limit)
    except (CorpusError, OSError, sqlite3.Error) as error:
        print(f"quarry corpus {args.corpus_command}: {error}", file=sys.stderr)
        return 2
    finally:
        if embedder is not None:
            embedder.close()
