"""`quarry papers new|snowball|venue`: the workers' literature skills, run by hand.

The worker's own code (worker_svc/web/papers.py), run in the command's process with the worker's settings:
the catalogues it names (QUARRY_WORKER_LITERATURE_CATALOGUES) at the addresses it gives. The command line
reaches it through the registry's lazy "module:attribute" string (quarry/cli/registry.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import httpx

from quarry.config import WorkerSettings
from worker_svc.web.papers import LiteratureSkills, Paper, describe
from worker_svc.web.search import SearchError


def run(args: argparse.Namespace, settings: WorkerSettings) -> int:
    return asyncio.run(_run(args, settings))


async def _run(args: argparse.Namespace, settings: WorkerSettings) -> int:
    async with httpx.AsyncClient() as client:
        skills = LiteratureSkills.of(settings, client)
        if skills is None:
            print(
                "quarry papers: no literature catalogue is configured: set QUARRY_WORKER_LITERATURE_CATALOGUES to "
                "arxiv, semantic_scholar or both",
                file=sys.stderr,
            )
            return 2
        try:
            listings = await _listings(args, skills)
        except SearchError as error:
            print(f"quarry papers: {error}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps([{"heading": heading, "papers": [_json(p) for p in papers]} for heading, papers in listings]))
        return 0
    for number, (heading, papers) in enumerate(listings):
        print(("\n" if number else "") + heading)
        print("\n".join(describe(paper) for paper in papers) if papers else "  none listed")
    return 0


async def _listings(args: argparse.Namespace, skills: LiteratureSkills) -> list[tuple[str, list[Paper]]]:
    """(heading, papers) for each listing the command asked for."""
    topic = args.topic or ""
    order = f"ranked against {topic!r}" if topic else ""
    if args.papers_command == "new":
        until = args.until or datetime.now(UTC).date()
        since = args.since or until - timedelta(days=1)
        papers = await skills.new_papers(args.category, since, until, topic, args.limit)
        return [
            (f"New on arXiv in {', '.join(args.category)} from {since} to {until}, {order or 'newest first'}:", papers)
        ]
    if args.papers_command == "venue":
        papers = await skills.venue_papers(args.venue, args.year, topic, args.limit)
        return [(f"{args.venue} {args.year}, {order or 'most cited first'}:", papers)]
    directions: tuple[Literal["references", "citations"], ...] = (
        ("references", "citations") if args.direction == "both" else (args.direction,)
    )
    listings = []
    for direction in directions:
        papers = await skills.snowball(args.paper, direction, topic, args.limit)
        what = "Cited by" if direction == "references" else "Citing"
        listings.append((f"{what} {args.paper}, {order or 'most cited first'}:", papers))
    return listings


def _json(paper: Paper) -> dict[str, Any]:
    fields = asdict(paper)
    fields.update(asdict(paper.result), published=paper.published and paper.published.isoformat())
    fields.pop("result")
    fields["full_text_urls"] = list(paper.full_text_urls)
    return fields
