"""A campaign's spec, as a human gave it, and the validation of what a human sends.

The spec is validated once, when the campaign starts (`validate_spec`), and stored as JSON; every
violation names the request field at fault, as the public API spells it. The spec also gives the
loop its limiter budgets (`limits`) and signal rules (`signal_rules`). Reasons and directives are
checked here too.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
import shlex
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import re2
from pydantic import TypeAdapter

from quarry import ids
from quarry.errors import FieldViolation, InvalidArgument
from quarry.records import signals
from quarry.records.signals import MetricGoal, SignalRules
from quarry.vocabulary import MetricDirection
from supervisor_svc.campaigns.limiter import DEFAULT_MAX_CONSECUTIVE_FAILURES, Limits


@dataclass(frozen=True)
class Brief:
    goal: str
    constraints: tuple[str, ...] = ()
    editable_paths: tuple[str, ...] = ()  # empty: any path that is not protected
    protected_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class Workspace:
    root: str
    host: str = ""  # "": the monitor's machine


@dataclass(frozen=True)
class Metric:
    """The metric the monitor reads from each experiment: a log pattern, or a key of a JSON-lines file."""

    name: str
    direction: MetricDirection | None  # None: not given (refused by validate_spec)
    log_regex: str = ""
    jsonl_path: str = ""  # relative to the workspace root
    jsonl_key: str = ""

    @property
    def goal(self) -> MetricGoal:
        if self.direction is None:
            raise ValueError("a metric without a direction has no goal")
        return MetricGoal(self.name, self.direction)


@dataclass(frozen=True)
class SlurmBatch:
    """An experiment as a Slurm batch job, submitted on the workspace's (SSH) host."""

    script_path: str  # relative to the workspace root
    sbatch_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Experiment:
    argv: tuple[str, ...] = ()
    command_line: str = ""  # instead of argv; validate_spec splits it into argv
    wall_clock_seconds: float | None = None
    gpu_count: int = 0
    gpu_indices: tuple[int, ...] = ()
    slurm: SlurmBatch | None = None  # instead of argv
    isolate_network: bool = False  # a local job in the monitor's sandbox, without a network


@dataclass(frozen=True)
class Budgets:
    """0 (or None) leaves a bound off, as in limiter.Limits."""

    tokens_per_hour: int = 0
    max_tokens: int = 0
    cycles_per_hour: int = 0
    max_cycles: int = 0
    stop_at: datetime | None = None
    max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE_FAILURES


@dataclass(frozen=True)
class Rules:
    baseline_runs: int = signals.DEFAULT_BASELINE_RUNS
    rebaseline_every: int = signals.DEFAULT_REBASELINE_EVERY
    stagnation_window: int = signals.DEFAULT_STAGNATION_WINDOW
    max_retests: int = signals.DEFAULT_MAX_RETESTS
    noise_epsilon: float = signals.DEFAULT_NOISE_EPSILON
    phase_gate: float | None = None
    stop_at_phase_gate: bool = False


@dataclass(frozen=True)
class CampaignSpec:
    brief: Brief
    workspace: Workspace
    metric: Metric
    experiment: Experiment
    title: str = ""
    budgets: Budgets = field(default_factory=Budgets)
    rules: Rules = field(default_factory=Rules)
    write_report_at_end: bool = False  # the writer's report before the loop completes the campaign

    def to_json(self) -> dict[str, Any]:
        json_value: dict[str, Any] = _SPEC.dump_python(self, mode="json")
        return json_value

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> CampaignSpec:
        return _SPEC.validate_python(value)

    def digest(self) -> str:
        """Equal for equal specs: what a reused request_id must ask for again."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    def limits(self) -> Limits:
        budgets = self.budgets
        return Limits(
            tokens_per_hour=budgets.tokens_per_hour,
            cycles_per_hour=budgets.cycles_per_hour,
            max_tokens=budgets.max_tokens,
            max_cycles=budgets.max_cycles,
            stop_at=budgets.stop_at,
            max_consecutive_failures=budgets.max_consecutive_failures,
        )

    def signal_rules(self) -> SignalRules:
        rules = self.rules
        return SignalRules(
            baseline_runs=rules.baseline_runs,
            rebaseline_every=rules.rebaseline_every,
            noise_epsilon=rules.noise_epsilon,
            max_retests=rules.max_retests,
            stagnation_window=rules.stagnation_window,
            phase_gate=rules.phase_gate,
        )


_SPEC: TypeAdapter[CampaignSpec] = TypeAdapter(CampaignSpec)


# -- validation --------------------------------------------------------------------------------------

MAX_TITLE_CHARS = 200
MAX_GOAL_CHARS = 4000
MAX_CONSTRAINTS = 50
MAX_CONSTRAINT_CHARS = 1000
MAX_PATHS = 100
MAX_PATH_CHARS = 512
MAX_ROOT_CHARS = 1024
MAX_HOST_CHARS = 64
MAX_PATTERN_CHARS = 1024
MAX_KEY_CHARS = 256
MAX_ARGS = 4096
MAX_SBATCH_ARGS = 64
MAX_SBATCH_ARG_CHARS = 1024
MAX_COMMAND_CHARS = 64 * 1024
MAX_WALL_CLOCK_SECONDS = 30 * 24 * 3600.0
MAX_GPUS = 64
MAX_GPU_INDEX = 1023
MAX_COUNT = 2**53  # token counts: exact in a double, and in JSON
MAX_CYCLES = 1_000_000
MAX_BASELINE_RUNS = 100
MAX_RULE_COUNT = 10_000
MAX_REASON_CHARS = 1000
MAX_DIRECTIVE_CHARS = 4000
_METRIC_NAME = re.compile(r"[A-Za-z0-9_./-]{1,64}")
_HOST = re.compile(rf"[\x21-\x7e]{{1,{MAX_HOST_CHARS}}}")


class _Violations:
    def __init__(self) -> None:
        self.found: list[FieldViolation] = []

    def add(self, field: str, description: str) -> None:
        self.found.append(FieldViolation(field, description))

    def text(self, field: str, value: str, max_chars: int, *, required: bool = False) -> None:
        if "\x00" in value:
            self.add(field, "must not contain NUL characters")
        elif len(value) > max_chars:
            self.add(field, f"at most {max_chars} characters")
        elif required and not value.strip():
            self.add(field, "required")

    def count(self, field: str, value: int, low: int, high: int) -> None:
        if not low <= value <= high:
            self.add(field, f"between {low} and {high}")

    def relative_path(self, field: str, path: str) -> None:
        if not path or "\x00" in path or len(path) > MAX_PATH_CHARS:
            self.add(field, f"1 to {MAX_PATH_CHARS} characters, without NUL")
        elif posixpath.isabs(path) or ".." in path.split("/"):
            self.add(field, "relative to the workspace root, without '..'")


def validate_spec(spec: CampaignSpec, now: datetime) -> CampaignSpec:
    """The spec as the campaign keeps it (its command split into argv); INVALID_ARGUMENT naming every field at
    fault otherwise."""
    found = _Violations()
    found.text("spec.title", spec.title, MAX_TITLE_CHARS)
    _check_brief(found, spec.brief)
    _check_workspace(found, spec.workspace)
    _check_metric(found, spec.metric)
    slurm = spec.experiment.slurm
    if slurm is None:
        argv = _check_command(found, spec.experiment)
    else:
        argv = ()
        _check_slurm(found, slurm, spec.experiment, spec.workspace)
    _check_limit_and_gpus(found, spec.experiment)
    if spec.experiment.isolate_network and spec.workspace.host:
        found.add("spec.experiment.isolate_network", "only a job on the monitor's own machine runs in its sandbox")
    _check_budgets(found, spec.budgets, now)
    _check_rules(found, spec.rules)
    if found.found:
        raise InvalidArgument(found.found)
    return replace(spec, experiment=replace(spec.experiment, argv=argv, command_line=""))


def _check_brief(found: _Violations, brief: Brief) -> None:
    found.text("spec.brief.goal", brief.goal, MAX_GOAL_CHARS, required=True)
    if len(brief.constraints) > MAX_CONSTRAINTS:
        found.add("spec.brief.constraints", f"at most {MAX_CONSTRAINTS}")
    for index, constraint in enumerate(brief.constraints[:MAX_CONSTRAINTS]):
        found.text(f"spec.brief.constraints[{index}]", constraint, MAX_CONSTRAINT_CHARS, required=True)
    for name, paths in (("editable_paths", brief.editable_paths), ("protected_paths", brief.protected_paths)):
        if len(paths) > MAX_PATHS:
            found.add(f"spec.brief.{name}", f"at most {MAX_PATHS}")
        for index, path in enumerate(paths[:MAX_PATHS]):
            found.relative_path(f"spec.brief.{name}[{index}]", path)


def _check_workspace(found: _Violations, workspace: Workspace) -> None:
    if workspace.host and not _HOST.fullmatch(workspace.host):
        found.add("spec.workspace.host", f"a configured host: 1 to {MAX_HOST_CHARS} printable characters, no spaces")
    root = workspace.root
    if not root or "\x00" in root or len(root) > MAX_ROOT_CHARS:
        found.add("spec.workspace.root", f"required: 1 to {MAX_ROOT_CHARS} characters, without NUL")
    elif not posixpath.isabs(root):
        found.add("spec.workspace.root", "an absolute path")


def _check_metric(found: _Violations, metric: Metric) -> None:
    prefix = "spec.metric"
    if not _METRIC_NAME.fullmatch(metric.name):
        found.add(f"{prefix}.name", "1 to 64 letters, digits, _ . / or -")
    if metric.direction is None:
        found.add(f"{prefix}.direction", "required: MINIMIZE or MAXIMIZE")
    if metric.log_regex and (metric.jsonl_path or metric.jsonl_key):
        found.add(f"{prefix}.log_regex", "either log_regex or jsonl_file, not both")
    elif metric.log_regex:
        fault = _pattern_fault(metric.log_regex)
        if fault:
            found.add(f"{prefix}.log_regex", fault)
    elif metric.jsonl_path or metric.jsonl_key:
        found.relative_path(f"{prefix}.jsonl_file.path", metric.jsonl_path)
        key = metric.jsonl_key
        if not key or "\x00" in key or len(key) > MAX_KEY_CHARS:
            found.add(f"{prefix}.jsonl_file.key", f"1 to {MAX_KEY_CHARS} characters, without NUL")
    else:
        found.add(f"{prefix}.log_regex", "required: log_regex or jsonl_file")


def _pattern_fault(pattern: str) -> str:
    """What is wrong with a log pattern for the monitor (RE2, one capture group), or ""."""
    if "\x00" in pattern or len(pattern) > MAX_PATTERN_CHARS:
        return f"at most {MAX_PATTERN_CHARS} characters, without NUL"
    try:
        compiled = re2.compile(pattern)
    except re2.error as error:
        return f"not a valid RE2 pattern: {error}"
    if compiled.groups != 1:
        return f"needs exactly one capture group, the number (it has {compiled.groups})"
    return ""


def _check_command(found: _Violations, experiment: Experiment) -> tuple[str, ...]:
    """The experiment's argv (its command line split); its faults as violations."""
    prefix = "spec.experiment"
    argv = experiment.argv
    if any("\x00" in arg for arg in argv) or "\x00" in experiment.command_line:
        found.add(f"{prefix}.argv", "must not contain NUL characters")
        argv = ()
    elif len(experiment.command_line) > MAX_COMMAND_CHARS or sum(map(len, argv)) > MAX_COMMAND_CHARS:
        found.add(f"{prefix}.argv", f"at most {MAX_COMMAND_CHARS} characters in all")
        argv = ()
    elif argv and experiment.command_line:
        found.add(f"{prefix}.command_line", "either argv or command_line, not both")
    elif experiment.command_line:
        try:
            argv = tuple(shlex.split(experiment.command_line))
        except ValueError as error:  # an unclosed quote, a trailing backslash
            found.add(f"{prefix}.command_line", f"cannot be split into arguments: {error}")
        else:
            if not argv:
                found.add(f"{prefix}.command_line", "names no program")
    elif not argv:
        found.add(f"{prefix}.argv", "required: the program and its arguments (or command_line)")
    if len(argv) > MAX_ARGS:
        found.add(f"{prefix}.argv", f"at most {MAX_ARGS} arguments")
    return argv


def _check_slurm(found: _Violations, slurm: SlurmBatch, experiment: Experiment, workspace: Workspace) -> None:
    prefix = "spec.experiment"
    if experiment.argv or experiment.command_line:
        found.add(f"{prefix}.slurm", "either argv (or command_line) or a Slurm batch script, not both")
    if not workspace.host:
        found.add("spec.workspace.host", "required with spec.experiment.slurm: the Slurm login host it is on")
    found.relative_path(f"{prefix}.slurm.script_path", slurm.script_path)
    if slurm.script_path.startswith("-"):
        found.add(f"{prefix}.slurm.script_path", "must not start with '-'")
    if len(slurm.sbatch_args) > MAX_SBATCH_ARGS:
        found.add(f"{prefix}.slurm.sbatch_args", f"at most {MAX_SBATCH_ARGS}")
    for index, arg in enumerate(slurm.sbatch_args[:MAX_SBATCH_ARGS]):
        found.text(f"{prefix}.slurm.sbatch_args[{index}]", arg, MAX_SBATCH_ARG_CHARS, required=True)
    if experiment.gpu_indices:
        found.add(f"{prefix}.gpus.indices", "Slurm picks the GPUs: ask for a count")


def _check_limit_and_gpus(found: _Violations, experiment: Experiment) -> None:
    prefix = "spec.experiment"
    seconds = experiment.wall_clock_seconds
    if seconds is None:
        found.add(f"{prefix}.wall_clock_limit", "required: the budget of one experiment")
    elif not 0 < seconds <= MAX_WALL_CLOCK_SECONDS:
        found.add(f"{prefix}.wall_clock_limit", "more than 0 s and at most 30 days")
    _check_gpus(found, experiment)


def _check_gpus(found: _Violations, experiment: Experiment) -> None:
    prefix = "spec.experiment.gpus"
    if experiment.gpu_count and experiment.gpu_indices:
        found.add(f"{prefix}.indices", "either a count or indices, not both")
    found.count(f"{prefix}.count", experiment.gpu_count, 0, MAX_GPUS)
    indices = experiment.gpu_indices
    if len(indices) > MAX_GPUS or len(set(indices)) != len(indices):
        found.add(f"{prefix}.indices", f"at most {MAX_GPUS} different indices")
    elif any(not 0 <= index <= MAX_GPU_INDEX for index in indices):
        found.add(f"{prefix}.indices", f"between 0 and {MAX_GPU_INDEX}")


def _check_budgets(found: _Violations, budgets: Budgets, now: datetime) -> None:
    prefix = "spec.budgets"
    found.count(f"{prefix}.max_tokens_per_hour", budgets.tokens_per_hour, 0, MAX_COUNT)
    found.count(f"{prefix}.max_tokens", budgets.max_tokens, 0, MAX_COUNT)
    found.count(f"{prefix}.max_cycles_per_hour", budgets.cycles_per_hour, 0, MAX_CYCLES)
    found.count(f"{prefix}.max_cycles", budgets.max_cycles, 0, MAX_CYCLES)
    found.count(f"{prefix}.max_consecutive_failures", budgets.max_consecutive_failures, 0, MAX_RULE_COUNT)
    if budgets.stop_at is not None and budgets.stop_at <= now:
        found.add(f"{prefix}.stop_time", "must be in the future")


def _check_rules(found: _Violations, rules: Rules) -> None:
    prefix = "spec.signals"
    found.count(f"{prefix}.baseline_runs", rules.baseline_runs, 2, MAX_BASELINE_RUNS)
    found.count(f"{prefix}.rebaseline_every", rules.rebaseline_every, 0, MAX_RULE_COUNT)
    found.count(f"{prefix}.stagnation_window", rules.stagnation_window, 0, MAX_RULE_COUNT)
    found.count(f"{prefix}.max_retests", rules.max_retests, 0, MAX_BASELINE_RUNS)
    if not (math.isfinite(rules.noise_epsilon) and 0 < rules.noise_epsilon <= 1e300):
        found.add(f"{prefix}.noise_epsilon", "a positive finite number")
    if rules.phase_gate is not None and not math.isfinite(rules.phase_gate):
        found.add(f"{prefix}.phase_gate", "a finite number")
    if rules.stop_at_phase_gate and rules.phase_gate is None:
        found.add(f"{prefix}.stop_at_phase_gate", "needs a phase_gate")


def check_campaign_id(campaign_id: str, field: str = "campaign_id") -> None:
    ids.CAMPAIGN_ID.require(field, campaign_id)


def reason_text(reason: str, default: str, field: str = "reason") -> str:
    """A pause, resume or stop reason as it is kept: trimmed, `default` when empty; NUL and over-long refused."""
    found = _Violations()
    found.text(field, reason, MAX_REASON_CHARS)
    if found.found:
        raise InvalidArgument(found.found)
    return reason.strip() or default


def check_directive(text: str, request_id: str) -> None:
    found = _Violations()
    found.text("text", text, MAX_DIRECTIVE_CHARS, required=True)
    violation = ids.REQUEST_ID.check("request_id", request_id, when_missing=None)
    if violation is not None:
        found.found.append(violation)
    if found.found:
        raise InvalidArgument(found.found)
