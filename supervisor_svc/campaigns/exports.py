"""The files a human reads in the workspace, rendered from the campaign's records.

They are copies, regenerated whole from the thread after each cycle: never read back, never
the source of truth, so an edit to one is simply overwritten.
"""

from __future__ import annotations

from collections.abc import Sequence

from quarry.records.campaign import CampaignRecord, DeadEnd, Insight, TrialRecord

EXPERIMENTS_FILE = "experiments.jsonl"
DEAD_ENDS_FILE = "DEAD_ENDS.md"
INSIGHTS_FILE = "INSIGHTS.md"

_GENERATED = "Generated from the campaign's records after each cycle; edits here are overwritten."


def workspace_exports(records: Sequence[CampaignRecord]) -> dict[str, str]:
    """Each exported file's content by its path in the workspace."""
    return {
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
    sections = [
        f"## Cycle {record.cycle}\n\n{record.text.strip()}\n" for record in records if isinstance(record, Insight)
    ]
    return _document("Insights", "Durable observations the campaign made.", sections)


def _document(title: str, summary: str, sections: Sequence[str]) -> str:
    body = "\n".join(sections) if sections else "None recorded yet.\n"
    return f"# {title}\n\n{summary} {_GENERATED}\n\n{body}"
