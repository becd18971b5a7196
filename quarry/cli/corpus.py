"""`quarry corpus index|list|remove|search`: the local corpus's folders, and its search tried by hand."""

from __future__ import annotations

import argparse
import sqlite3
import sys
from datetime import datetime
from pathlib import Path

from worker_svc.corpus import Corpus, CorpusError, IndexReport, Root


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


def _index(corpus: Corpus, folder: Path) -> int:
    report = corpus.index_folder(folder)
    _print_report(report, folder.resolve(), corpus.index_path)
    for root in corpus.roots():
        if root.folder is None:
            print(
                f"  the index still holds {root.documents} documents indexed before folders were recorded;"
                f" once their folder is indexed again, `quarry corpus remove {root.name}` drops them"
            )
    return 0


def _list(corpus: Corpus) -> int:
    roots = corpus.roots()
    if not roots:
        print(f"{corpus.index_path}: no folders indexed; add one with `quarry corpus index FOLDER`")
        return 0
    width = max(len(root.name) for root in roots)
    for root in roots:
        print(f"{root.name:<{width}}  {root.documents:>6} documents  indexed {_when(root)}  {_where(root)}")
    return 0


def _remove(corpus: Corpus, which: str) -> int:
    root = corpus.remove_root(which)
    print(f"removed {root.name} ({_where(root)}) and its {root.documents} documents from {corpus.index_path}")
    return 0


def _search(corpus: Corpus, query: str, limit: int) -> int:
    hits = corpus.hits(query, limit)
    if not hits:
        print(f"no document in {corpus.index_path} matches {query!r}", file=sys.stderr)
        return 1
    for rank, hit in enumerate(hits, start=1):
        print(f"{rank}. {hit.result.title}")
        print(f"   {hit.result.url}" + (f"  ({hit.file})" if hit.file else ""))
        print(f"   {' '.join(hit.result.snippet.split())}")
    return 0


def run(args: argparse.Namespace, index: Path) -> int:
    """One `quarry corpus` command against the index file."""
    corpus = Corpus(index)
    try:
        if args.corpus_command == "index":
            return _index(corpus, args.folder)
        if args.corpus_command == "list":
            return _list(corpus)
        if args.corpus_command == "remove":
            return _remove(corpus, args.root)
        return _search(corpus, args.query, args.limit)
    except (CorpusError, OSError, sqlite3.Error) as error:
        print(f"quarry corpus {args.corpus_command}: {error}", file=sys.stderr)
        return 2
