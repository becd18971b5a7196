"""`quarry lab start`'s campaign spec, read from its file and flags.

A campaign is started from a TOML file, from flags, or both (flags win). The file has the sections
of the campaign spec (docs/architecture.md, "Campaigns"):

    title = "tiny regression"
    write_report_at_end = true        # the writer's report before the campaign completes (quarry lab report)
    [brief]
    goal = "Lower the validation loss."
    constraints = ["Keep the model under 1M parameters."]
    editable_paths = ["train.py", "config.toml"]
    protected_paths = ["eval.py", "data/"]
    [workspace]
    root = "/home/me/tiny"            # a git working tree; host = "gpu1" for a monitor host
    [metric]
    name = "val_loss"
    direction = "minimize"
    log_regex = 'val_loss=(\\S+)'     # or jsonl_path = "metrics.jsonl" and jsonl_key = "val_loss"
    [experiment]
    command = "python3 train.py"      # split as a shell would, never run by one (or argv = [...])
    # or, with the workspace on a Slurm login host: slurm_script = "train.sh" (in the workspace root),
    # sbatch_args = ["--partition=gpu"]; its output is the log the metric is read from
    wall_clock_seconds = 300
    gpus = 1                          # or gpu_indices = [0]
    isolate_network = true            # no network for the job (a local job, in the monitor's sandbox)
    [budgets]
    max_tokens_per_hour = 200000
    max_cycles = 50
    stop_time = 2026-12-24T08:00:00Z
    [signals]
    baseline_runs = 3
    phase_gate = 0.05
    stop_at_phase_gate = true
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quarry.v1 import campaign_pb2, monitor_pb2


class SpecError(ValueError):
    """The campaign file or flags do not make a spec (the server checks the values themselves)."""


# -- the spec from TOML and flags ---------------------------------------------------------------------

# section -> key -> kind; "" is the top level.
_SCHEMA: dict[str, dict[str, str]] = {
    "": {"title": "str", "write_report_at_end": "bool"},
    "brief": {"goal": "str", "constraints": "strs", "editable_paths": "strs", "protected_paths": "strs"},
    "workspace": {"host": "str", "root": "str"},
    "metric": {"name": "str", "direction": "str", "log_regex": "str", "jsonl_path": "str", "jsonl_key": "str"},
    "experiment": {
        "command": "str",
        "argv": "strs",
        "wall_clock_seconds": "number",
        "gpus": "int",
        "gpu_indices": "ints",
        "slurm_script": "str",
        "sbatch_args": "strs",
        "isolate_network": "bool",
    },
    "budgets": {
        "max_tokens_per_hour": "int",
        "max_tokens": "int",
        "max_cycles_per_hour": "int",
        "max_cycles": "int",
        "stop_time": "time",
        "max_consecutive_failures": "int",
    },
    "signals": {
        "baseline_runs": "int",
        "rebaseline_every": "int",
        "stagnation_window": "int",
        "max_retests": "int",
        "noise_epsilon": "number",
        "phase_gate": "number",
        "stop_at_phase_gate": "bool",
    },
}
_DIRECTIONS = {"minimize": monitor_pb2.METRIC_DIRECTION_MINIMIZE, "maximize": monitor_pb2.METRIC_DIRECTION_MAXIMIZE}


def _checked(where: str, kind: str, value: Any) -> Any:
    fits = {
        "str": isinstance(value, str),
        "strs": isinstance(value, list) and all(isinstance(item, str) for item in value),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "ints": isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "time": isinstance(value, str | datetime),
    }[kind]
    if not fits:
        wanted = {"strs": "a list of strings", "ints": "a list of integers", "time": "a date and time with a zone"}
        raise SpecError(f"{where}: must be {wanted.get(kind, f'a {kind}')}")
    if kind == "time":
        try:
            moment = datetime.fromisoformat(value) if isinstance(value, str) else value
        except ValueError:
            raise SpecError(f"{where}: not a date and time (e.g. 2026-12-24T08:00:00Z)") from None
        if moment.tzinfo is None:
            raise SpecError(f"{where}: needs a time zone (e.g. 2026-12-24T08:00:00Z)")
        return moment.astimezone(UTC)
    return value


def _sections(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The file's values by section, every key known and of the right type."""
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SCHEMA}
    for key, value in data.items():
        if key in _SCHEMA and key:
            if not isinstance(value, dict):
                raise SpecError(f"[{key}] must be a table")
            for inner, item in value.items():
                kind = _SCHEMA[key].get(inner)
                if kind is None:
                    raise SpecError(f"{key}.{inner}: not a setting of [{key}] ({', '.join(_SCHEMA[key])})")
                sections[key][inner] = _checked(f"{key}.{inner}", kind, item)
        elif key in _SCHEMA[""]:
            sections[""][key] = _checked(key, _SCHEMA[""][key], value)
        else:
            raise SpecError(f"{key}: not a campaign setting ({', '.join([*_SCHEMA[''], *list(_SCHEMA)[1:]])})")
    return sections


def spec_from_settings(data: Mapping[str, Any]) -> campaign_pb2.CampaignSpec:
    """The CampaignSpec a campaign file (parsed TOML) describes."""
    sections = _sections(data)
    brief, workspace, metric = sections["brief"], sections["workspace"], sections["metric"]
    experiment, budgets, signals = sections["experiment"], sections["budgets"], sections["signals"]
    spec = campaign_pb2.CampaignSpec(
        title=sections[""].get("title", ""),
        write_report_at_end=sections[""].get("write_report_at_end", False),
        brief=campaign_pb2.CampaignBrief(
            goal=brief.get("goal", ""),
            constraints=brief.get("constraints", []),
            editable_paths=brief.get("editable_paths", []),
            protected_paths=brief.get("protected_paths", []),
        ),
        workspace=campaign_pb2.CampaignWorkspace(host=workspace.get("host", ""), root=workspace.get("root", "")),
        experiment=campaign_pb2.CampaignExperiment(
            argv=experiment.get("argv", []),
            command_line=experiment.get("command", ""),
            gpus=monitor_pb2.GpuRequest(count=experiment.get("gpus", 0), indices=experiment.get("gpu_indices", [])),
            isolate_network=experiment.get("isolate_network", False),
        ),
    )
    direction = metric.get("direction", "")
    if direction and direction not in _DIRECTIONS:
        raise SpecError("metric.direction: minimize or maximize")
    spec.metric.name = metric.get("name", "")
    spec.metric.direction = _DIRECTIONS.get(direction, monitor_pb2.METRIC_DIRECTION_UNSPECIFIED)
    if "log_regex" in metric:
        spec.metric.log_regex = metric["log_regex"]
    if "jsonl_path" in metric or "jsonl_key" in metric:
        spec.metric.jsonl_file.path = metric.get("jsonl_path", "")
        spec.metric.jsonl_file.key = metric.get("jsonl_key", "")
    if "slurm_script" in experiment or "sbatch_args" in experiment:
        spec.experiment.slurm.script_path = experiment.get("slurm_script", "")
        spec.experiment.slurm.sbatch_args.extend(experiment.get("sbatch_args", []))
    if "wall_clock_seconds" in experiment:
        spec.experiment.wall_clock_limit.FromNanoseconds(round(experiment["wall_clock_seconds"] * 1e9))
    for key in ("max_tokens_per_hour", "max_tokens", "max_cycles_per_hour", "max_cycles", "max_consecutive_failures"):
        if key in budgets:
            setattr(spec.budgets, key, budgets[key])
    if "stop_time" in budgets:
        spec.budgets.stop_time.FromDatetime(budgets["stop_time"])
    for key, value in signals.items():
        setattr(spec.signals, key, value)
    return spec


# The campaign file's key each valued flag sets, "section.key" (a top-level key alone), with the flag's dest.
FLAG_DESTS: dict[str, str] = {
    "title": "title",
    "brief.goal": "goal",
    "brief.constraints": "constraint",
    "brief.editable_paths": "editable",
    "brief.protected_paths": "protected",
    "workspace.host": "host",
    "workspace.root": "root",
    "metric.name": "metric",
    "metric.direction": "direction",
    "metric.log_regex": "log_regex",
    "metric.jsonl_path": "jsonl_path",
    "metric.jsonl_key": "jsonl_key",
    "experiment.command": "experiment_command",
    "experiment.slurm_script": "slurm_script",
    "experiment.wall_clock_seconds": "experiment_seconds",
    "experiment.gpus": "gpus",
    **{f"budgets.{key}": key for key in _SCHEMA["budgets"]},
    "signals.baseline_runs": "baseline_runs",
    "signals.phase_gate": "phase_gate",
}
# The campaign file's key each switch sets to true.
SWITCH_DESTS: dict[str, str] = {
    "write_report_at_end": "report_at_end",
    "experiment.isolate_network": "isolate_network",
    "signals.stop_at_phase_gate": "stop_at_gate",
}
# A dest whose flag is not --<dest with dashes>.
_FLAG_OF_DEST = {"experiment_command": "--command"}
# The API's field under `spec.` -> the campaign file's key, where the two differ.
_FILE_KEY_OF_FIELD = {
    "experiment.wall_clock_limit": "experiment.wall_clock_seconds",
    "experiment.command_line": "experiment.command",
    "experiment.gpus.count": "experiment.gpus",
    "experiment.gpus.indices": "experiment.gpu_indices",
    "experiment.slurm.script_path": "experiment.slurm_script",
    "experiment.slurm.sbatch_args": "experiment.sbatch_args",
    "metric.jsonl_file.path": "metric.jsonl_path",
    "metric.jsonl_file.key": "metric.jsonl_key",
    "metric.jsonl_file": "metric.jsonl_path",
    "experiment.slurm": "experiment.slurm_script",
}


def settings_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The campaign file's shape for the flags given (None: not given), to lay over the file."""
    given: dict[str, Any] = {}
    chosen = {key: getattr(args, dest) for key, dest in FLAG_DESTS.items()}
    chosen |= {key: True if getattr(args, dest) else None for key, dest in SWITCH_DESTS.items()}
    for key, value in chosen.items():
        if value is None:
            continue
        section, _, name = key.rpartition(".")
        (given.setdefault(section, {}) if section else given)[name] = value
    return given


def user_name(field: str) -> str:
    """An API field of a CampaignSpec as the person starting the campaign named it: the flag, and the campaign
    file's key (`--baseline-runs (signals.baseline_runs in the file)`); the field itself when it is neither."""
    path = field.removeprefix("spec.")
    bare = path.split("[", 1)[0]  # brief.constraints[2] -> brief.constraints
    key = next(
        (file_key for api, file_key in _FILE_KEY_OF_FIELD.items() if bare == api or bare.startswith(f"{api}.")),
        bare,
    )
    dest = FLAG_DESTS.get(key) or SWITCH_DESTS.get(key)
    known = key in FLAG_DESTS or key in SWITCH_DESTS or key.partition(".")[2] in _SCHEMA.get(key.partition(".")[0], {})
    if not known:
        return field
    flag = _FLAG_OF_DEST.get(dest, f"--{dest.replace('_', '-')}") if dest else ""
    return f"{flag} ({key} in the campaign file)" if flag else f"{key} in the campaign file"


def load_settings(path: Path | None, flags: Mapping[str, Any]) -> dict[str, Any]:
    """The campaign file (if any) with the flags laid over it, section by section."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise SpecError(f"{path}: {error}") from None
    for key, value in flags.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data
