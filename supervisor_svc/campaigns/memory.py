"""What THINK reads, computed from the campaign's records: the two-tier memory and the bounded lists.

The two tiers are the seed's: the brief (the human's, frozen, given as written) and a compacted
log of milestones (a baseline measured, an improvement kept) and of the leader's latest
decisions. The log is never stored: it is recomputed from the records, so compacting it loses
nothing. Caps are in characters and hold whatever the records say: every list keeps its newest
lines, marks how many older ones it left out, and one line never runs past `LINE_CAP`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quarry.records.campaign import (
    CampaignRecord,
    DeadEnd,
    Decision,
    Directive,
    DirectiveConsumed,
    Insight,
    TrialRecord,
    Verdict,
)
from quarry.records.signals import MetricGoal, Signals, baseline_batches

MILESTONES_CAP = 1_200
DECISIONS_KEPT = 15
LOG_CAP = 2_000  # milestones and decisions together, without the brief
RECENT_EXPERIMENTS = 10
RECENT_EXPERIMENTS_CAP = 2_000
DEAD_ENDS_CAP = 2_000
INSIGHTS_CAP = 1_500
LINE_CAP = 300

_MILESTONES = "Milestones:"
_DECISIONS = "Latest decisions:"
_NONE = "(none yet)"


@dataclass(frozen=True)
class MemoryView:
    brief: str
    log: str  # milestones, then the latest decisions: at most LOG_CAP characters


@dataclass(frozen=True)
class ThinkBriefing:
    """Everything THINK is given besides its instructions."""

    memory: MemoryView
    signals: str
    recent_experiments: str
    dead_ends: str
    insights: str
    directives: tuple[Directive, ...]

    def render(self) -> str:
        directives = "\n".join(f"- {directive.text}" for directive in self.directives) or "(none)"
        return "\n\n".join(
            [
                f"## Brief\n{self.memory.brief}",
                f"## Memory\n{self.memory.log}",
                f"## Signals\n{self.signals}",
                f"## Recent experiments\n{self.recent_experiments or _NONE}",
                f"## Dead ends (never retry these)\n{self.dead_ends or _NONE}",
                f"## Insights\n{self.insights or _NONE}",
                f"## Directives from the human (follow them this cycle)\n{directives}",
            ]
        )


def memory_view(
    brief: str, records: Sequence[CampaignRecord], goal: MetricGoal, *, before_cycle: int | None = None
) -> MemoryView:
    """The brief and the log; `before_cycle`: only decisions of earlier cycles (THINK reads the later ones among
    its recent experiments, each with its result: the log goes further back instead of repeating them)."""
    trials = _trials(records)
    milestones = _section(_MILESTONES, _milestones(trials, goal), MILESTONES_CAP, "milestones")
    decisions = [
        f"cycle {record.cycle}: {record.text}"
        for record in records
        if isinstance(record, Decision) and (before_cycle is None or record.cycle < before_cycle)
    ]
    room = LOG_CAP - len(milestones) - 2  # the blank line between the sections
    latest = _section(_DECISIONS, decisions[-DECISIONS_KEPT:], room, "decisions", total=len(decisions))
    return MemoryView(brief, f"{milestones}\n\n{latest}")


def think_briefing(brief: str, records: Sequence[CampaignRecord], signals: Signals) -> ThinkBriefing:
    trials = _trials(records)
    recent = [_experiment_line(record) for record in trials]
    dead_ends = [f"cycle {r.cycle}: {r.approach} -- {r.reason}" for r in records if isinstance(r, DeadEnd)]
    insights = [f"cycle {record.cycle}: {record.text}" for record in records if isinstance(record, Insight)]
    experiments = _bounded(recent[-RECENT_EXPERIMENTS:], RECENT_EXPERIMENTS_CAP, "experiments", len(recent))
    shown = sum(1 for line in experiments.splitlines() if line.startswith("cycle "))
    first_shown = trials[-shown].cycle if shown else None
    return ThinkBriefing(
        memory=memory_view(brief, records, signals.goal, before_cycle=first_shown),
        signals=signals.describe(),
        recent_experiments=experiments,
        dead_ends=_bounded(dead_ends, DEAD_ENDS_CAP, "dead ends"),
        insights=_bounded(insights, INSIGHTS_CAP, "insights"),
        directives=pending_directives(records),
    )


def pending_directives(records: Sequence[CampaignRecord]) -> tuple[Directive, ...]:
    """Directives not yet given to a THINK, oldest first, each request_id once."""
    consumed = {record.request_id for record in records if isinstance(record, DirectiveConsumed)}
    pending: dict[str, Directive] = {}
    for record in records:
        if isinstance(record, Directive) and record.request_id not in consumed:
            pending.setdefault(record.request_id, record)
    return tuple(pending.values())


def _trials(records: Sequence[CampaignRecord]) -> list[TrialRecord]:
    """The experiment rows (trials), in cycle order."""
    return [record for record in records if isinstance(record, TrialRecord)]


def _milestones(trials: Sequence[TrialRecord], goal: MetricGoal) -> list[str]:
    """One line per baseline batch and per kept improvement, in cycle order."""
    lines: list[tuple[int, str]] = []
    for batch in baseline_batches(trials):
        values = [value for record in batch if (value := record.metric(goal.name)) is not None]
        first, last = batch[0].cycle, batch[-1].cycle
        cycles = f"cycle {first}" if first == last else f"cycles {first}-{last}"
        mean = f"{sum(values) / len(values):.6g}" if values else "no value"
        lines.append((first, f"{cycles}: baseline {goal.name} {mean} over {len(values)} runs{_at(batch[-1])}"))
    for record in trials:
        if record.verdict is Verdict.KEEP:
            kept = f"kept {goal.name} {_value(record, goal.name)}{_at(record)}"
            lines.append((record.cycle, f"cycle {record.cycle}: {kept}: {record.hypothesis}"))
    return [line for _, line in sorted(lines, key=lambda item: item[0])]


def _experiment_line(record: TrialRecord) -> str:
    metrics = ", ".join(f"{name}={_value(record, name)}" for name in record.metrics) or "no metrics"
    job = f", job {record.job_state}" if record.job_state is not None else ""
    conclusion = f" -> {record.conclusion}" if record.conclusion else ""
    return (
        f"cycle {record.cycle} {record.verdict.upper()} ({metrics}{job}){_at(record)}: {record.hypothesis}{conclusion}"
    )


def _value(record: TrialRecord, name: str) -> str:
    value = record.metric(name)
    return "none" if value is None else f"{value:.6g}"


def _at(record: TrialRecord) -> str:
    return f" at {record.commit[:12]}" if record.commit else ""


def _section(title: str, lines: Sequence[str], cap: int, noun: str, total: int = 0) -> str:
    """A titled list within `cap` characters, title included."""
    body = _bounded(lines, cap - len(title) - 1, noun, total) if lines else _NONE
    return f"{title}\n{body}"


def _bounded(lines: Sequence[str], cap: int, noun: str, total: int = 0) -> str:
    """The newest of `lines` that fit in `cap` characters, one per line, under a count of the older ones left out.

    `total`: how many lines there were before the caller kept only `lines`, the newest of them.
    """
    total = max(total, len(lines))
    clipped = [clip_line(line, LINE_CAP) for line in lines]
    whole = "\n".join(clipped)
    if total == len(lines) and len(whole) <= cap:
        return whole
    used = len(_marker(total, noun))  # the longest the marker can be
    kept: list[str] = []
    for line in reversed(clipped):
        if used + 1 + len(line) > cap:
            break
        kept.append(line)
        used += 1 + len(line)
    if not kept and clipped and cap - used - 1 > 0:
        kept.append(clip_line(clipped[-1], cap - used - 1))
    marker = _marker(total - len(kept), noun)
    return clip_line(marker, cap) if len(marker) > cap else "\n".join([marker, *reversed(kept)])


def _marker(count: int, noun: str) -> str:
    return f"[{count} older {noun} left out]"


def clip_line(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    return line[: limit - 1] + "…" if limit > 0 else ""
