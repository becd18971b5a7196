"""The violation scan: what a cycle did, checked against the brief's rules and the job's budget, as records.

The scan costs nothing (no model call): its input is data the loop already has, the paths the
cycle's commit changed and how long its job ran. Violations are recorded and shown to THINK and
the human; deciding what they cost the campaign is the loop's business.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from quarry.records.campaign import Violation, ViolationKind
from quarry.vocabulary import JobState


@dataclass(frozen=True)
class ScanRules:
    """From the campaign's brief and settings; paths are relative to the workspace root."""

    protected_paths: tuple[str, ...] = ()  # a file, a directory (all under it) or a glob
    metric_paths: tuple[str, ...] = ()  # the files the monitor's parser reads the metrics from
    job_budget_seconds: float = 0.0  # 0: no budget


@dataclass(frozen=True)
class CycleActivity:
    """What one cycle did: the paths its commit changed, and its job."""

    cycle: int
    changed_paths: tuple[str, ...] = ()
    job_id: str = ""
    job_state: JobState | None = None
    job_seconds: float | None = None  # wall-clock time the job ran; None when unknown or not run


def scan_violations(activity: CycleActivity, rules: ScanRules) -> tuple[Violation, ...]:
    """Every rule the cycle broke, in a fixed order: metric files, protected paths, then the job's budget."""
    changed = sorted({_normal(path) for path in activity.changed_paths})
    metric_files = {_normal(path) for path in rules.metric_paths}
    found = [
        Violation(
            cycle=activity.cycle,
            rule=ViolationKind.METRIC_FILE_EDITED,
            subject=path,
            detail=f"the cycle's commit changed {path}, which the metric is read from",
        )
        for path in changed
        if path in metric_files
    ]
    for path in changed:
        rule = _protecting_rule(path, rules.protected_paths)
        if rule is not None:
            found.append(
                Violation(
                    cycle=activity.cycle,
                    rule=ViolationKind.PROTECTED_PATH_TOUCHED,
                    subject=path,
                    detail=f"the cycle's commit changed {path}, protected by {rule!r}",
                )
            )
    over_budget = _over_budget(activity, rules.job_budget_seconds)
    if over_budget:
        found.append(
            Violation(
                cycle=activity.cycle,
                rule=ViolationKind.JOB_OVER_BUDGET,
                subject=activity.job_id,
                detail=over_budget,
            )
        )
    return tuple(found)


def _protecting_rule(path: str, rules: Sequence[str]) -> str | None:
    """The rule protecting `path`, or None: as the monitor's workspaces decide it.

    A rule protects a path equal to it or matching it as a glob (case-sensitive, `*` also matches
    "/"), and everything under such a path.
    """
    parts = _normal(path).split("/")
    normal_rules = [(rule, _normal(rule)) for rule in rules]
    for depth in range(1, len(parts) + 1):
        prefix = "/".join(parts[:depth])
        for rule, normal in normal_rules:
            if prefix == normal or fnmatchcase(prefix, normal):
                return rule
    return None


def _over_budget(activity: CycleActivity, budget_seconds: float) -> str:
    """Why the job broke its budget, or "" when it did not."""
    if activity.job_state is JobState.TIMED_OUT:
        return f"job {activity.job_id} was stopped at its time limit"
    if budget_seconds and activity.job_seconds is not None and activity.job_seconds > budget_seconds:
        return f"job {activity.job_id} ran {activity.job_seconds:.0f} s, over its budget of {budget_seconds:.0f} s"
    return ""


def _normal(path: str) -> str:
    return posixpath.normpath(path).lstrip("/")
