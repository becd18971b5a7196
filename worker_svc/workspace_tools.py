"""An engineer's code tools: list_tree, read_file, search_code, write_file, apply_patch, run_command and
launch_experiment, each backed by the monitor's workspace and job RPCs.

The tools take no workspace id: they reach the one workspace the delegation names, bound into the
session before the model sees anything. The session remembers the experiments launched and the
files changed, which the delegation result hands back to the caller as data. run_command is for a
short smoke test (its wall-clock limit is capped, and it waits for the end); launch_experiment
starts the real run and returns at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from quarry.agent.tools import Tool, ToolError
from quarry.compute import ComputeView, MonitorError
from quarry.vocabulary import JobLook, JobRef, MetricDirection
from quarry.workspace import Experiment, MetricWanted, WorkspaceView

MAX_LISTED = 300  # tree entries shown to the model
MAX_SHOWN_MATCHES = 100
MAX_WALL_CLOCK_SECONDS = 30 * 24 * 3600.0  # as the monitor allows
# A smoke test's end is awaited this much past its limit: the monitor's stop grace (TERM, then KILL).
_STOP_SLACK_SECONDS = 30.0


@dataclass
class WorkspaceSession:
    """One delegation's workspace: bound to its id, and what the tools did there."""

    view: WorkspaceView
    compute: ComputeView
    command_seconds: float  # the most a run_command may run
    jobs: list[JobRef] = field(default_factory=list)  # launched experiments, in order
    files_changed: list[str] = field(default_factory=list)  # in the order first changed

    def changed(self, *paths: str) -> None:
        self.files_changed.extend(path for path in dict.fromkeys(paths) if path not in self.files_changed)


class WorkspaceAccess(Protocol):
    """What a run must provide to use the workspace tools: None for every role but the engineer."""

    workspace: WorkspaceSession | None


def _session(context: WorkspaceAccess) -> WorkspaceSession:
    if context.workspace is None:
        raise ToolError("this task has no workspace")
    return context.workspace


class TreeParams(BaseModel):
    path: str = Field(default="", description="a directory relative to the workspace root; empty: the root")
    max_depth: int = Field(default=3, ge=1, le=16)


class ReadFileParams(BaseModel):
    path: str = Field(description="a file relative to the workspace root")
    start_line: int = Field(default=1, ge=1)
    end_line: int = Field(default=0, ge=0, description="the last line to read; 0: the end of the file")


class SearchCodeParams(BaseModel):
    pattern: str = Field(min_length=1, description="a Python regular expression, matched against each line")
    path: str = Field(default="", description="a directory or file to search; empty: the whole workspace")
    glob: str = Field(default="", description='only files matching this, e.g. "*.py"')
    case_insensitive: bool = False


class WriteFileParams(BaseModel):
    path: str = Field(description="a file relative to the workspace root; missing directories are created")
    content: str = Field(description="the whole new content")


class ApplyPatchParams(BaseModel):
    patch: str = Field(min_length=1, description="a unified diff (as `git diff` prints it), paths relative to the root")


class RunCommandParams(BaseModel):
    command: str = Field(min_length=1, description="a command line, split as a shell would but never run by one")
    working_directory: str = Field(default="", description="relative to the workspace root; empty: the root")
    timeout_seconds: float = Field(default=60.0, gt=0, description="stopped past this; capped for smoke tests")


class MetricParams(BaseModel):
    name: str = Field(description="letters, digits and _ . / -")
    direction: Literal["minimize", "maximize"]
    log_regex: str = Field(default="", description="a pattern with one group matching the number in a log line")
    jsonl_file: str = Field(default="", description="or a JSON-lines file the job writes (relative to its directory)")
    jsonl_key: str = Field(default="", description="the key of the number in that file's objects")


class LaunchParams(BaseModel):
    command: str = Field(min_length=1, description="a command line, split as a shell would but never run by one")
    working_directory: str = Field(default="", description="relative to the workspace root; empty: the root")
    wall_clock_limit_seconds: float = Field(gt=0, le=MAX_WALL_CLOCK_SECONDS, description="stopped past this")
    gpus: int = Field(default=0, ge=0, le=64, description="how many GPUs the monitor picks for it")
    gpu_indices: list[int] = Field(default_factory=list, description="or these GPUs")
    metrics: list[MetricParams] = Field(default_factory=list, description="numbers the monitor reads for it")
    environment: dict[str, str] = Field(default_factory=dict)


async def list_tree(params: TreeParams, context: WorkspaceAccess) -> str:
    try:
        tree = await _session(context).view.tree(params.path, max_depth=params.max_depth)
    except MonitorError as error:
        raise ToolError(str(error)) from error
    shown = tree.entries[:MAX_LISTED]
    lines = [
        f"{entry.path}/" + (" (not listed)" if entry.children_omitted else "")
        if entry.kind == "directory"
        else f"{entry.path} ({entry.size} bytes)"
        if entry.kind == "file"
        else f"{entry.path} ({entry.kind})"
        for entry in shown
    ]
    if tree.truncated or len(tree.entries) > len(shown):
        lines.append("... more entries: list a subdirectory")
    return "\n".join(lines) or "The directory is empty."


async def read_file(params: ReadFileParams, context: WorkspaceAccess) -> str:
    try:
        text = await _session(context).view.read(params.path, start_line=params.start_line, end_line=params.end_line)
    except MonitorError as error:
        raise ToolError(str(error)) from error
    if text.binary:
        return f"{params.path} is binary ({text.size} bytes); it is not shown."
    if not text.end_line:
        return f"{params.path} has no lines there ({text.size} bytes)."
    header = f"{params.path}, lines {text.start_line}-{text.end_line}"
    more = f"\n... continue from line {text.end_line + 1}" if text.truncated else ""
    return f"{header}:\n{text.content}{more}"


async def search_code(params: SearchCodeParams, context: WorkspaceAccess) -> str:
    try:
        found = await _session(context).view.search(
            params.pattern, path=params.path, glob=params.glob, case_insensitive=params.case_insensitive
        )
    except MonitorError as error:
        raise ToolError(str(error)) from error
    if not found.matches:
        return f"No line matches {params.pattern!r}."
    lines = [f"{m.path}:{m.line_number}: {m.line}" for m in found.matches[:MAX_SHOWN_MATCHES]]
    if found.truncated or len(found.matches) > MAX_SHOWN_MATCHES:
        lines.append("... more matches: narrow the pattern, path or glob")
    return "\n".join(lines)


async def write_file(params: WriteFileParams, context: WorkspaceAccess) -> str:
    session = _session(context)
    try:
        written = await session.view.write(params.path, params.content)
    except MonitorError as error:
        raise ToolError(str(error)) from error
    session.changed(params.path)
    return f"{'Created' if written.created else 'Wrote'} {params.path} ({written.size} bytes)."


async def apply_patch(params: ApplyPatchParams, context: WorkspaceAccess) -> str:
    session = _session(context)
    try:
        patched = await session.view.patch(params.patch)
    except MonitorError as error:
        raise ToolError(str(error)) from error
    session.changed(*patched.paths)
    parts = [
        f"{verb}: {', '.join(paths)}"
        for verb, paths in (("modified", patched.modified), ("created", patched.created), ("deleted", patched.deleted))
        if paths
    ]
    return "Applied; " + "; ".join(parts) + "." if parts else "The patch changed nothing."


def describe_look(look: JobLook) -> str:
    """A job's state, exit code, metrics and last log lines, as the model reads them."""
    text = f"{look.state}" + (f", exit code {look.exit_code}" if look.exit_code is not None else "")
    text += f" ({look.detail})" if look.detail else ""
    for metric in look.metrics:
        if metric.value is None:
            text += f"\nmetric {metric.name}: not found ({metric.detail})"
        else:
            text += f"\nmetric {metric.name}: {metric.value:g} (best {metric.best:g} of {metric.count} values)"
    if look.log_tail:
        text += "\nLast log lines:\n" + "\n".join(look.log_tail)
    return text


async def run_command(params: RunCommandParams, context: WorkspaceAccess) -> str:
    session = _session(context)
    if params.timeout_seconds > session.command_seconds:
        raise ToolError(
            f"run_command is for smoke tests of at most {session.command_seconds:g} s; "
            "start a longer run with launch_experiment"
        )
    experiment = Experiment(params.command, params.timeout_seconds, working_directory=params.working_directory)
    try:
        launched = await session.view.launch(experiment)
        look = await session.compute.wait(launched.job, seconds=params.timeout_seconds + _STOP_SLACK_SECONDS)
    except MonitorError as error:
        raise ToolError(str(error)) from error
    return describe_look(look)


async def launch_experiment(params: LaunchParams, context: WorkspaceAccess) -> str:
    session = _session(context)
    for index, metric in enumerate(params.metrics):
        if bool(metric.log_regex) == bool(metric.jsonl_file or metric.jsonl_key):
            raise ToolError(f"metrics[{index}]: give either log_regex, or jsonl_file and jsonl_key")
    experiment = Experiment(
        params.command,
        params.wall_clock_limit_seconds,
        working_directory=params.working_directory,
        gpu_count=params.gpus,
        gpu_indices=tuple(params.gpu_indices),
        metrics=tuple(
            MetricWanted(
                m.name,
                MetricDirection(m.direction),
                log_regex=m.log_regex,
                jsonl_path=m.jsonl_file,
                jsonl_key=m.jsonl_key,
            )
            for m in params.metrics
        ),
        environment=params.environment,
    )
    try:
        launched = await session.view.launch(experiment)
    except MonitorError as error:
        raise ToolError(str(error)) from error
    session.jobs.append(launched.job)
    job = launched.job
    gpus = f"; GPUs {', '.join(map(str, launched.gpus))}" if launched.gpus else ""
    return (
        f"Launched job {job.monitor_job_id} (log {job.log_path}{gpus}). It runs on its own; "
        f"job_status with monitor_job_id {job.monitor_job_id!r} shows its state, and its metrics once it ends."
    )


WORKSPACE_TOOLS: list[Tool[Any, WorkspaceAccess]] = [
    Tool("list_tree", "Files and directories of the workspace, with sizes.", TreeParams, list_tree),
    Tool("read_file", "A file of the workspace, or a range of its lines.", ReadFileParams, read_file),
    Tool("search_code", "Lines of the workspace's files matching a regular expression.", SearchCodeParams, search_code),
    Tool(
        "write_file", "Write a whole file of the workspace (protected paths are refused).", WriteFileParams, write_file
    ),
    Tool(
        "apply_patch",
        "Apply a unified diff to the workspace: every hunk applies, or nothing changes.",
        ApplyPatchParams,
        apply_patch,
    ),
    Tool(
        "run_command",
        "Run a short command in the workspace (a smoke test) and wait for its exit status and last log lines.",
        RunCommandParams,
        run_command,
    ),
    Tool(
        "launch_experiment",
        "Start a run in the workspace with a wall-clock limit, GPUs and metrics; returns its job id at once.",
        LaunchParams,
        launch_experiment,
    ),
]
