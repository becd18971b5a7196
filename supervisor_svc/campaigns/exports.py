"""The files a human reads in the workspace, rendered from the campaign's records.

They are copies, regenerated whole from the thread after each cycle: never read back, never
the source of truth, so an edit to one is simply overwritten. They live in the workspace's
EXPORTS_DIR, whose own .gitignore ignores everything in it, itself included: git never sees them,
so no commit takes them along, no reset to a kept commit reverts them, and a cycle that changed
nothing else still has nothing to commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from quarry.records.campaign import CampaignRecord, DeadEnd, Insight, TrialRecord

EXPORTS_DIR = ".campaign"
IGNORE_FILE = f"{EXPORTS_DIR}/.gitignore"
EXPERIMENTS_FILE = f"{EXPORTS_DIR}/experiments.jsonl"
DEAD_ENDS_FILE = f"{EXPORTS_DIR}/DEAD_ENDS.md"
INSIGHTS_FILE = f"{EXPORTS_DIR}/INSIGHTS.md"
# Ignores the folder's every file, this one too: nothing in it is ever staged.
_IGNORE_ALL = "# Written by the campaign: its journals, regenerated after each cycle and never committed.\n*\n"

_GENERATED = "Generated from the campaign's records after each cycle; edits here are overwritten."


def workspace_exports(records: Sequence[CampaignRecord]) -> dict[str, str]:
    """Each exported file's content by its path in the workspace, the folder's .gitignore first."""
    return {
        IGNORE_FILE: _IGNORE_ALL,
        EXPERIMENTS_FILE: experiments_jsonl(records),
        DEAD_ENDS_FILE: dead_ends_markdown(records),
        INSIGHTS_FILE: insights_markdown(records),
    }


def experiments_jsonl(records: Sequence[CampaignRecord]) -> str:
    """One JSON line per trial (experiment row), in cycle order: the records exactly as stored."""
    return "".join(f"{record.to_json()}\n" for record in records if isinstance(record, TrialRecord))


def dead_ends_markdown(records: Sequence[CampaignRecord]) -> str:
    sections = [
        f"## Cycle {r.cycle}\n\n**Tried:** {r.approach.strip()}\n\n**Why it failed:** {r.reason.strip()}\n"
        for r in records
        if isinstance(r, DeadEnd)
    ]
    return _document("Dead ends", "Approaches that failed. The campaign never retries them.", sections)


def insights_markdown(records: Sequence[CampaignRecord]) -> str:
    sections = [_insight(record) for record in records if isinstance(record, Insight)]
    return _document("Insights", "Durable observations the campaign made.", sections)


def _insight(insight: Insight) -> str:
    cited = "".join(
        f'\n- finding {source.finding_ref}: {source.url}, "{source.excerpt.strip()}"' for source in insight.sources
    )
    return f"## Cycle {insight.cycle}\n\n{insight.text.strip()}\n" + (f"\n**Sources:**\n{cited}\n" if cited else "")


def _document(title: str, summary: str, sections: Sequence[str]) -> str:
    body = "\n".join(sections) if sections else "None recorded yet.\n"
    return f"# {title}\n\n{summary} {_GENERATED}\n\n{body}"
