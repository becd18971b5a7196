"""The violation scan: a cycle's changed paths and job, checked against the brief's rules and the budget."""

from __future__ import annotations

import pytest

from quarry.records.campaign import ViolationKind
from quarry.vocabulary import JobState
from supervisor_svc.campaigns.violations import CycleActivity, ScanRules, scan_violations

RULES = ScanRules(
    protected_paths=("data", "eval/*.py", "prepare.py"),
    metric_paths=("results/metrics.json",),
    job_budget_seconds=300,
)


def test_a_clean_cycle_breaks_no_rule() -> None:
    activity = CycleActivity(cycle=4, changed_paths=("train.py", "config.toml", "datasets.py"), job_seconds=299.0)
    assert scan_violations(activity, RULES) == ()


@pytest.mark.parametrize(
    ("path", "rule"),
    [("data/val.csv", "data"), ("data", "data"), ("eval/score.py", "eval/*.py"), ("./prepare.py", "prepare.py")],
)
def test_a_changed_protected_path_is_a_violation(path: str, rule: str) -> None:
    (violation,) = scan_violations(CycleActivity(cycle=4, changed_paths=(path,)), RULES)
    assert violation.rule is ViolationKind.PROTECTED_PATH_TOUCHED
    assert violation.cycle == 4
    assert violation.subject == path.removeprefix("./")
    assert repr(rule) in violation.detail


def test_a_rule_protects_whole_names_only() -> None:
    activity = CycleActivity(cycle=4, changed_paths=("database.py", "prepare.py.bak", "Data/x"))
    assert scan_violations(activity, RULES) == ()


def test_an_edited_metric_file_is_a_violation() -> None:
    (violation,) = scan_violations(CycleActivity(cycle=5, changed_paths=("results/metrics.json",)), RULES)
    assert violation.rule is ViolationKind.METRIC_FILE_EDITED
    assert violation.subject == "results/metrics.json"


@pytest.mark.parametrize(
    ("state", "seconds", "said"),
    [(JobState.COMPLETED, 301.0, "ran 301 s, over its budget of 300 s"), (JobState.TIMED_OUT, None, "time limit")],
)
def test_a_job_over_its_budget_is_a_violation(state: JobState, seconds: float | None, said: str) -> None:
    activity = CycleActivity(cycle=6, job_id="job-6", job_state=state, job_seconds=seconds)
    (violation,) = scan_violations(activity, RULES)
    assert violation.rule is ViolationKind.JOB_OVER_BUDGET
    assert violation.subject == "job-6"
    assert said in violation.detail


def test_without_a_budget_a_long_job_is_no_violation() -> None:
    activity = CycleActivity(cycle=6, job_id="job-6", job_state=JobState.COMPLETED, job_seconds=10**6)
    assert scan_violations(activity, ScanRules()) == ()


def test_every_broken_rule_is_reported_in_a_fixed_order() -> None:
    activity = CycleActivity(
        cycle=7,
        changed_paths=("data/b.csv", "results/metrics.json", "data/a.csv", "data/a.csv"),
        job_id="job-7",
        job_state=JobState.TIMED_OUT,
    )
    rules = ScanRules(protected_paths=(*RULES.protected_paths, "results"), metric_paths=RULES.metric_paths)
    found = [(violation.rule, violation.subject) for violation in scan_violations(activity, rules)]
    assert found == [
        (ViolationKind.METRIC_FILE_EDITED, "results/metrics.json"),
        (ViolationKind.PROTECTED_PATH_TOUCHED, "data/a.csv"),
        (ViolationKind.PROTECTED_PATH_TOUCHED, "data/b.csv"),
        (ViolationKind.PROTECTED_PATH_TOUCHED, "results/metrics.json"),
        (ViolationKind.JOB_OVER_BUDGET, "job-7"),
    ]
