"""Metrics read by code from a job's log or its JSON-lines file: validated at submission, evaluated by the monitor.

A log pattern is RE2 (google-re2): matching takes time linear in the line, and
each line is cut to MAX_LINE_CHARS first, so a pattern costs bounded work per
line whatever it is (no catastrophic backtracking; no lookaround or
backreferences either). Patterns are compiled once, when the job is submitted or
its record reloaded. A value is the pattern's one group read as a finite number;
the last value wins, and the best (by the metric's direction) and the count are
kept. A metric no value was read for is "not found", which says nothing about
how the job ended.

A job's output is hostile input: a line that cannot be read (nested too deep,
NaN or infinite, a number too large for a float, anything that raises) is
skipped and counted, never the end of the job's supervision.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import re2

from quarry.errors import FieldViolation, InvalidArgument
from quarry.vocabulary import MetricDirection

MAX_METRICS = 32
MAX_PATTERN_CHARS = 1024
MAX_LINE_CHARS = 4096  # a longer line is matched on its start only
MAX_POINTS = 10_000  # per job, for watchers; older points are dropped (the statistics keep counting)
MAX_JSONL_LINE_BYTES = 64 * 1024  # longer lines of a metrics file are skipped
MAX_JSON_DEPTH = 64  # a line nested deeper is skipped before it is parsed (the parser recurses)
_NAME = re.compile(r"[A-Za-z0-9_./-]{1,64}")
_MAX_KEY_CHARS = 256
_MAX_PATH_CHARS = 1024
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_OPENING = b"[{"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricSpec:
    """A number a job reports: from a pattern over its log lines, or a key of a JSON-lines file it writes."""

    name: str
    direction: MetricDirection | None  # None: not given (refused at submission)
    log_regex: str = ""
    jsonl_path: str = ""  # relative to the job's working directory
    jsonl_key: str = ""


@dataclass(frozen=True)
class MetricPoint:
    """One value as it appeared in the log: `step` is its line number (from 1)."""

    name: str
    value: float
    step: int


@dataclass(frozen=True)
class MetricResult:
    """A metric once its job has ended: the last value, the best by its direction, and how many were read."""

    name: str
    direction: MetricDirection
    value: float | None = None  # None: not found
    best: float | None = None
    count: int = 0
    detail: str = ""

    @property
    def found(self) -> bool:
        return self.value is not None


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the caller's error, not the monitor's log
    options.max_mem = 2 << 20  # a pattern whose program needs more is refused at submission
    return options


@dataclass(frozen=True)
class CompiledMetric:
    spec: MetricSpec
    pattern: re2._Regexp[str] | None = None  # a log metric's pattern


def compile_metrics(specs: Sequence[MetricSpec], *, working_directory: str) -> tuple[CompiledMetric, ...]:
    """The metrics of a submission, each pattern compiled; every fault is a violation naming its field."""
    if len(specs) > MAX_METRICS:
        raise InvalidArgument([FieldViolation("options.metrics", f"at most {MAX_METRICS} metrics")])
    violations: list[FieldViolation] = []
    compiled = []
    names: set[str] = set()
    for index, spec in enumerate(specs):
        prefix = f"options.metrics[{index}]"
        if not _NAME.fullmatch(spec.name):
            violations.append(FieldViolation(f"{prefix}.name", "1 to 64 letters, digits, _ . / or -"))
        elif spec.name in names:
            violations.append(FieldViolation(f"{prefix}.name", "another metric of this job has this name"))
        names.add(spec.name)
        if spec.direction is None:
            violations.append(FieldViolation(f"{prefix}.direction", "required: MINIMIZE or MAXIMIZE"))
        if spec.log_regex:
            pattern, fault = _compiled(spec.log_regex)
            if fault:
                violations.append(FieldViolation(f"{prefix}.log_regex", fault))
            compiled.append(CompiledMetric(spec, pattern))
        elif spec.jsonl_path or spec.jsonl_key:
            violations.extend(_jsonl_violations(spec, f"{prefix}.jsonl_file", working_directory))
            compiled.append(CompiledMetric(spec))
        else:
            violations.append(FieldViolation(f"{prefix}.log_regex", "required: log_regex or jsonl_file"))
    if violations:
        raise InvalidArgument(violations)
    return tuple(compiled)


def _compiled(pattern: str) -> tuple[re2._Regexp[str] | None, str]:
    """(the compiled pattern, "") or (None, what is wrong with it)."""
    if "\x00" in pattern:
        return None, "must not contain NUL characters"
    if len(pattern) > MAX_PATTERN_CHARS:
        return None, f"at most {MAX_PATTERN_CHARS} characters"
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as error:
        reason = error.args[0] if error.args else error
        text = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        return None, f"not a valid RE2 pattern: {text}"
    if compiled.groups != 1:
        return None, f"needs exactly one capture group, the number (it has {compiled.groups})"
    return compiled, ""


def _jsonl_violations(spec: MetricSpec, prefix: str, working_directory: str) -> list[FieldViolation]:
    violations = []
    path = spec.jsonl_path
    if not path:
        violations.append(FieldViolation(f"{prefix}.path", "required: the file, relative to the working directory"))
    elif "\x00" in path or len(path) > _MAX_PATH_CHARS:
        violations.append(FieldViolation(f"{prefix}.path", f"at most {_MAX_PATH_CHARS} characters, without NUL"))
    elif posixpath.isabs(path) or ".." in path.split("/"):
        violations.append(FieldViolation(f"{prefix}.path", "relative to the working directory, without '..'"))
    elif not working_directory:
        violations.append(
            FieldViolation(f"{prefix}.path", "needs the job's working_directory, which it is relative to")
        )
    key = spec.jsonl_key
    if not key or "\x00" in key or len(key) > _MAX_KEY_CHARS:
        violations.append(FieldViolation(f"{prefix}.key", f"1 to {_MAX_KEY_CHARS} characters, without NUL"))
    return violations


def _number(text: str) -> float | None:
    try:
        value = float(text[:MAX_LINE_CHARS])
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Scan:
    """What a run of log lines held: the values found, and per metric how many matches were not numbers."""

    points: list[MetricPoint]
    unreadable: dict[str, int]


def scan_lines(metrics: Sequence[CompiledMetric], lines: Sequence[str], first_line: int) -> Scan:
    """The log metrics' values in `lines`, numbered from `first_line` (pure: runs in a worker thread)."""
    points: list[MetricPoint] = []
    unreadable: dict[str, int] = {}
    failed = 0
    for number, line in enumerate(lines, start=first_line):
        text = line[:MAX_LINE_CHARS]
        for metric in metrics:
            if metric.pattern is None:
                continue
            try:
                match = metric.pattern.search(text)
                value = None if match is None else _number(match.group(1) or "")
            except Exception:  # whatever a line holds, it is one line skipped
                failed += 1
                continue
            if match is None:
                continue
            if value is None:
                unreadable[metric.spec.name] = unreadable.get(metric.spec.name, 0) + 1
            else:
                points.append(MetricPoint(metric.spec.name, value, number))
    if failed:
        log.debug("%d log line(s) from line %d could not be matched; skipped", failed, first_line)
    return Scan(points, unreadable)


def jsonl_values(spec: MetricSpec, lines: Iterable[bytes]) -> list[float]:
    """The values of the spec's key in a JSON-lines file, in order (pure); a line that is not an object with a
    finite number there (or is too long, nested too deep, or not JSON) is skipped."""
    values = []
    skipped = 0
    for raw in lines:
        if not raw.strip():
            continue
        try:
            value = _jsonl_value(raw, spec.jsonl_key)
        except Exception:  # whatever a line holds, it is one line skipped
            value = None
        if value is None:
            skipped += 1
        else:
            values.append(value)
    if skipped:
        log.debug("%d line(s) of %s had no number at %r; skipped", skipped, spec.jsonl_path, spec.jsonl_key)
    return values


def _jsonl_value(raw: bytes, key: str) -> float | None:
    if len(raw) > MAX_JSONL_LINE_BYTES or too_deep(raw):
        return None
    entry = json.loads(raw)
    return _json_number(entry.get(key)) if isinstance(entry, dict) else None


def too_deep(raw: bytes) -> bool:
    """Whether a JSON text nests deeper than MAX_JSON_DEPTH, told cheaply: at once when it has too few
    brackets to, else by its brackets outside strings, up to the first too deep."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False
    depth = 0
    for bracket in _STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS):
        depth += 1 if bracket in _OPENING else -1
        if depth > MAX_JSON_DEPTH:
            return True
    return False


def _json_number(value: object) -> float | None:
    """A JSON number as a finite float (not a boolean, nor NaN or an infinity, nor an integer too large for a
    float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


@dataclass
class _Stats:
    last: float | None = None
    best: float | None = None
    count: int = 0
    unreadable: int = 0


class MetricTracker:
    """A job's metrics as read so far: statistics per metric, and the latest log values for watchers."""

    def __init__(self, metrics: tuple[CompiledMetric, ...]) -> None:
        self.metrics = metrics
        self.lines_read = 0
        self.problem = ""  # why the log could not be read, when it could not
        self._directions = {metric.spec.name: metric.spec.direction for metric in metrics}
        self._stats: dict[str, _Stats] = {}
        self._points: collections.deque[tuple[int, MetricPoint]] = collections.deque(maxlen=MAX_POINTS)
        self._sequence = 0
        self._missing: dict[str, str] = {}  # why a file metric has no values

    @property
    def reads_log(self) -> bool:
        return any(metric.pattern is not None for metric in self.metrics)

    def add_lines(self, scan: Scan, lines: int) -> None:
        self.lines_read += lines
        for name, count in scan.unreadable.items():
            self._stats.setdefault(name, _Stats()).unreadable += count
        for point in scan.points:
            self._sequence += 1
            self._points.append((self._sequence, point))
            self._count(point.name, point.value)

    def add_file(self, spec: MetricSpec, values: Sequence[float], missing: str = "") -> None:
        for value in values:
            self._count(spec.name, value)
        if missing:
            self._missing[spec.name] = missing

    def _count(self, name: str, value: float) -> None:
        stats = self._stats.setdefault(name, _Stats())
        better = min if self._directions[name] is MetricDirection.MINIMIZE else max
        stats.last, stats.count = value, stats.count + 1
        stats.best = value if stats.best is None else better(stats.best, value)

    def points_after(self, sequence: int) -> tuple[tuple[MetricPoint, ...], int]:
        """The log values recorded after `sequence` (those still kept), and the sequence to ask after next."""
        newer = [point for number, point in self._points if number > sequence]
        return tuple(newer), self._sequence

    def results(self) -> tuple[MetricResult, ...]:
        return tuple(self._result(metric) for metric in self.metrics)

    def _result(self, metric: CompiledMetric) -> MetricResult:
        spec = metric.spec
        direction = spec.direction or MetricDirection.MINIMIZE
        stats = self._stats.get(spec.name, _Stats())
        notes = []
        if stats.unreadable:
            notes.append(f"{stats.unreadable} match(es) were not numbers")
        if stats.count:
            return MetricResult(spec.name, direction, stats.last, stats.best, stats.count, "; ".join(notes))
        if metric.pattern is not None:
            notes.insert(0, f"no line of the log ({self.lines_read} read) matched {spec.log_regex!r}")
        else:
            missing = self._missing.get(spec.name, "")
            notes.insert(0, missing or f"no line of {spec.jsonl_path} has a number at {spec.jsonl_key!r}")
        if self.problem:
            notes.append(self.problem)
        return MetricResult(spec.name, direction, detail="; ".join(notes))
