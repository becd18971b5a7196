"""`quarry lab`: campaigns from a terminal (start, list, show, pause, resume, stop, direct, ledger, watch, plot).

A campaign is started from a TOML file, from flags, or both (flags win). The file has the sections
of the campaign spec (docs/architecture.md, "Campaigns"):

    title = "tiny regression"
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
    [budgets]
    max_tokens_per_hour = 200000
    max_cycles = 50
    stop_time = 2026-12-24T08:00:00Z
    [signals]
    baseline_runs = 3
    phase_gate = 0.05
    stop_at_phase_gate = true

The ledger and the plot read the campaign's ledger rows, each with the signals the campaign computed
after it (ListLedgerRows); `show` prints the signals now (GetCampaign). The live view folds the
campaign's events, computing the best so far with the kernel's signal rules, the campaign's own.
They need nothing but the supervisor's address.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from quarry.cli.ask import Supervisor, name_of
from quarry.clients.campaigns import CampaignsClient
from quarry.records import signals as defaults
from quarry.records.contract import ledger_record
from quarry.records.signals import Direction, MetricGoal, SignalRules, read_signals
from quarry.v1 import campaign_pb2, monitor_pb2

_SHOWN_ROWS = 8
_SHOWN_LOG_LINES = 10


class SpecError(ValueError):
    """The campaign file or flags do not make a spec (the server checks the values themselves)."""


# -- the spec from TOML and flags ---------------------------------------------------------------------

# section -> key -> kind; "" is the top level.
_SCHEMA: dict[str, dict[str, str]] = {
    "": {"title": "str"},
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


def settings_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The campaign file's shape for the flags given (None: not given), to lay over the file."""
    flags = {
        "": {"title": args.title},
        "brief": {
            "goal": args.goal,
            "constraints": args.constraint,
            "editable_paths": args.editable,
            "protected_paths": args.protected,
        },
        "workspace": {"host": args.host, "root": args.root},
        "metric": {
            "name": args.metric,
            "direction": args.direction,
            "log_regex": args.log_regex,
            "jsonl_path": args.jsonl_path,
            "jsonl_key": args.jsonl_key,
        },
        "experiment": {
            "command": args.experiment_command,
            "slurm_script": args.slurm_script,
            "wall_clock_seconds": args.experiment_seconds,
            "gpus": args.gpus,
        },
        "budgets": {
            "max_tokens_per_hour": args.max_tokens_per_hour,
            "max_tokens": args.max_tokens,
            "max_cycles_per_hour": args.max_cycles_per_hour,
            "max_cycles": args.max_cycles,
            "stop_time": args.stop_time,
            "max_consecutive_failures": args.max_consecutive_failures,
        },
        "signals": {"baseline_runs": args.baseline_runs, "phase_gate": args.phase_gate},
    }
    if args.stop_at_gate:
        flags["signals"]["stop_at_phase_gate"] = True
    given: dict[str, Any] = {}
    for section, values in flags.items():
        chosen = {key: value for key, value in values.items() if value is not None}
        if section:
            if chosen:
                given[section] = chosen
        else:
            given.update(chosen)
    return given


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


# -- the commands ---------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, supervisor: Supervisor) -> int:
    command = args.lab_command
    if command == "start":
        try:
            settings = load_settings(args.file, settings_from_flags(args))
            spec = spec_from_settings(settings)
        except SpecError as error:
            Console(stderr=True).print(f"quarry lab start: {escape(str(error))}", highlight=False)
            return 2
        return await start(supervisor, spec, request_id=args.request_id, as_json=args.json)
    async with supervisor.campaigns() as client:
        if command == "list":
            return await _list(client, args.state or "", args.limit, as_json=args.json)
        if command == "show":
            campaign = await client.get_campaign(args.campaign_id)
            if args.json:
                print(json.dumps(json_format.MessageToDict(campaign)))
            else:
                _show(Console(), campaign)
            return 0
        if command in ("pause", "resume", "stop"):
            change = {
                "pause": client.pause_campaign,
                "resume": client.resume_campaign,
                "stop": client.stop_campaign,
            }[command]
            campaign = await change(args.campaign_id, args.reason)
            print(f"{campaign.campaign_id}: {name_of(campaign_pb2.CampaignState, campaign.state)}")
            return 0
        if command == "direct":
            request_id = args.request_id or str(uuid.uuid4())
            directive = await client.send_directive(args.campaign_id, args.text, request_id=request_id)
            state = name_of(campaign_pb2.DirectiveState, directive.state)
            print(f"directive {directive.request_id}: {state} (the next THINK reads it once)")
            return 0
        if command == "ledger":
            rows = await client.ledger(args.campaign_id)
            _print_ledger(rows, await client.get_campaign(args.campaign_id), as_jsonl=args.jsonl)
            return 0
        if command == "watch":
            return await watch(client, args.campaign_id)
        output = args.output or Path(f"{args.campaign_id}.png")
        campaign = await client.get_campaign(args.campaign_id)
        plot(campaign, await client.ledger(args.campaign_id), output)
        print(f"wrote {output}")
        return 0


async def start(supervisor: Supervisor, spec: campaign_pb2.CampaignSpec, *, request_id: str, as_json: bool) -> int:
    async with supervisor.campaigns() as client:
        campaign = await client.start_campaign(spec, request_id=request_id)
    if as_json:
        print(json.dumps(json_format.MessageToDict(campaign)))
    else:
        state = name_of(campaign_pb2.CampaignState, campaign.state)
        print(f"campaign {campaign.campaign_id}: {state}, on branch {campaign.branch}")
        print(f"follow it with: quarry lab watch {campaign.campaign_id}")
    return 0


async def _list(client: CampaignsClient, state: str, limit: int, *, as_json: bool) -> int:
    unset = campaign_pb2.CAMPAIGN_STATE_UNSPECIFIED
    value = campaign_pb2.CampaignState.Value(f"CAMPAIGN_STATE_{state.upper()}") if state else unset
    response = await client.list_campaigns(page_size=limit, state=value)
    if as_json:
        for campaign in response.campaigns:
            print(json.dumps(json_format.MessageToDict(campaign)))
        return 0
    table = Table("state", "phase", "cycle", "best", "created", "title")
    table.add_column("campaign", no_wrap=True)  # whole, so it can be copied into other commands
    for campaign in response.campaigns:
        table.add_row(
            name_of(campaign_pb2.CampaignState, campaign.state),
            name_of(campaign_pb2.CampaignPhase, campaign.phase),
            str(campaign.cycle),
            _number(campaign.best_value) if campaign.HasField("best_value") else "",
            campaign.create_time.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"),
            (campaign.spec.title or campaign.spec.brief.goal)[:60],
            campaign.campaign_id,
        )
    Console().print(table)
    return 0


def _number(value: float) -> str:
    return f"{value:.6g}"


def _budget(used: int, bound: int) -> str:
    return f"{used} of {bound}" if bound else f"{used} (no bound)"


def _experiment(experiment: campaign_pb2.CampaignExperiment) -> str:
    if experiment.HasField("slurm"):
        return " ".join(["sbatch", *experiment.slurm.sbatch_args, experiment.slurm.script_path]) + " (Slurm)"
    return " ".join(experiment.argv)


def _show(console: Console, campaign: campaign_pb2.Campaign) -> None:
    spec = campaign.spec
    console.print(Text(spec.title or spec.brief.goal, style="bold"))
    state = name_of(campaign_pb2.CampaignState, campaign.state)
    phase = name_of(campaign_pb2.CampaignPhase, campaign.phase)
    lines = [
        f"{campaign.campaign_id}: {state}, {phase} of cycle {campaign.cycle}",
        f"goal: {spec.brief.goal}",
        f"workspace: {spec.workspace.host or 'the monitor machine'}:{spec.workspace.root}, branch {campaign.branch}",
        f"experiment: {_experiment(spec.experiment)}",
    ]
    direction = name_of(monitor_pb2.MetricDirection, spec.metric.direction)
    best = _number(campaign.best_value) if campaign.HasField("best_value") else "not measured yet"
    floor = _number(campaign.noise_floor) if campaign.HasField("noise_floor") else "not measured yet"
    lines.append(f"metric: {spec.metric.name} ({direction}); best {best}; noise floor {floor}")
    if campaign.HasField("signals"):
        lines.append(_standing(campaign.signals))
    budgets, usage = spec.budgets, campaign.usage
    lines.append(
        f"tokens: {_budget(usage.tokens, budgets.max_tokens)}; "
        f"last hour {_budget(usage.tokens_last_hour, budgets.max_tokens_per_hour)}; "
        f"cycles: {_budget(usage.cycles, budgets.max_cycles)}"
    )
    if campaign.pending_directives:
        lines.append(f"directives waiting for the next THINK: {campaign.pending_directives}")
    if campaign.sleep_reason:
        until = campaign.sleep_until.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")
        lines.append(f"sleeping until {until}: {campaign.sleep_reason}")
    if campaign.pause_reason:
        lines.append(f"paused: {campaign.pause_reason}")
    if campaign.end_reason:
        lines.append(f"{state}: {campaign.end_reason}")
    for line in lines:
        console.print(Text(line))


def _standing(signals: campaign_pb2.CampaignSignals) -> str:
    """The campaign's signals as GetCampaign computed them, on one line."""
    parts = [f"{signals.experiments} experiments, {signals.experiments_since_keep} since the last kept improvement"]
    if signals.stagnant:
        parts.append("STAGNANT")
    if signals.baseline_runs_needed:
        parts.append(f"baseline runs needed: {signals.baseline_runs_needed}")
    if signals.retest_commit:
        parts.append(f"retest pending: {signals.retest_commit[:10]}")
    if signals.phase_gate_cleared:
        parts.append("phase gate cleared")
    return "; ".join(parts)


def _metric(row: campaign_pb2.LedgerRow, name: str) -> str:
    for metric in row.metrics:
        if metric.name == name:
            return _number(metric.value) if metric.HasField("value") else "-"
    return "-"


def ledger_table(rows: Sequence[campaign_pb2.LedgerRow], metric: str) -> Table:
    table = Table("cycle", "verdict", metric, "job", "commit", "tokens", "hypothesis", "conclusion")
    for row in rows:
        table.add_row(
            str(row.cycle),
            name_of(campaign_pb2.LedgerVerdict, row.verdict),
            _metric(row, metric),
            name_of(monitor_pb2.JobState, row.job_state) if row.job_state else "-",
            row.commit[:10] or "-",
            str(row.tokens_used),
            row.hypothesis[:60],
            row.conclusion[:60],
        )
    return table


def _print_ledger(rows: Sequence[campaign_pb2.LedgerRow], campaign: campaign_pb2.Campaign, *, as_jsonl: bool) -> None:
    if as_jsonl:
        for row in rows:
            print(json.dumps(json_format.MessageToDict(row)))
        return
    Console().print(ledger_table(rows, campaign.spec.metric.name))


def signal_inputs(spec: campaign_pb2.CampaignSpec) -> tuple[MetricGoal, SignalRules]:
    """The metric goal and signal rules of a campaign's spec, unset values as the server reads them."""
    maximize = spec.metric.direction == monitor_pb2.METRIC_DIRECTION_MAXIMIZE
    goal = MetricGoal(spec.metric.name, Direction.MAXIMIZE if maximize else Direction.MINIMIZE)
    rules = spec.signals

    def optional(name: Any, default: int) -> int:  # Any: HasField's stubs take only literal names
        value: int = getattr(rules, name) if rules.HasField(name) else default
        return value

    return goal, SignalRules(
        baseline_runs=rules.baseline_runs or defaults.DEFAULT_BASELINE_RUNS,
        rebaseline_every=optional("rebaseline_every", defaults.DEFAULT_REBASELINE_EVERY),
        noise_epsilon=rules.noise_epsilon or defaults.DEFAULT_NOISE_EPSILON,
        max_retests=optional("max_retests", defaults.DEFAULT_MAX_RETESTS),
        stagnation_window=optional("stagnation_window", defaults.DEFAULT_STAGNATION_WINDOW),
        phase_gate=rules.phase_gate if rules.HasField("phase_gate") else None,
    )


def plot(campaign: campaign_pb2.Campaign, rows: Sequence[campaign_pb2.LedgerRow], output: Path) -> None:
    """The campaign's plot as `quarry lab plot` writes it (matplotlib is imported only here: it is slow)."""
    from quarry.cli.lab_plot import plot_ledger

    title = f"{campaign.spec.title or campaign.spec.brief.goal[:60]} ({campaign.campaign_id})"
    plot_ledger(rows, campaign.spec.metric, output, title=title)


# -- the live view --------------------------------------------------------------------------------------


@dataclass
class CampaignView:
    """What `quarry lab watch` shows, folded from the campaign's events."""

    campaign: campaign_pb2.Campaign
    status: str = ""
    job: campaign_pb2.CampaignJobProgressEvent | None = None
    log: list[str] = field(default_factory=list)
    rows: list[campaign_pb2.LedgerRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def apply(self, event: campaign_pb2.CampaignEvent) -> None:
        payload = event.WhichOneof("payload")
        campaign = self.campaign
        if payload == "phase_changed":
            changed = event.phase_changed
            campaign.phase, campaign.cycle = changed.phase, changed.cycle
            campaign.state = campaign_pb2.CAMPAIGN_STATE_RUNNING
            self.status = changed.message
        elif payload == "ledger_recorded":
            self.rows.append(event.ledger_recorded)
            self.job = None
        elif payload == "job_progress":
            self.job = event.job_progress
            self.log = [*self.log, *event.job_progress.log_tail][-_SHOWN_LOG_LINES:]
        elif payload == "sleeping":
            campaign.state = campaign_pb2.CAMPAIGN_STATE_SLEEPING
            until = event.sleeping.until.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")
            self.status = f"sleeping until {until}: {event.sleeping.reason}"
        elif payload == "paused":
            campaign.state, self.status = campaign_pb2.CAMPAIGN_STATE_PAUSED, f"paused: {event.paused.reason}"
        elif payload == "resumed":
            campaign.state, self.status = campaign_pb2.CAMPAIGN_STATE_QUEUED, f"resumed: {event.resumed.reason}"
        elif payload == "directive_received":
            self.notes.append(f"directive: {event.directive_received.text}")
        elif payload == "directive_consumed":
            consumed = event.directive_consumed
            self.notes.append(f"directive {consumed.request_id} read by cycle {consumed.cycle}")
        elif payload == "signal":
            self.notes.append(f"{name_of(campaign_pb2.CampaignSignalKind, event.signal.kind)}: {event.signal.message}")
        elif payload == "violation":
            violation = event.violation
            rule = name_of(campaign_pb2.ViolationRule, violation.rule)
            self.notes.append(f"violation ({rule}) {violation.subject}: {violation.detail}")
        elif payload == "ended":
            campaign.state, self.status = event.ended.state, event.ended.reason
        self.notes = self.notes[-_SHOWN_ROWS:]

    def best(self) -> str:
        """The kept state's value, as the campaign computes it from the ledger so far."""
        if not self.rows:
            return _number(self.campaign.best_value) if self.campaign.HasField("best_value") else "not measured yet"
        goal, rules = signal_inputs(self.campaign.spec)
        signals = read_signals([ledger_record(row) for row in self.rows], goal, rules)
        if signals.best is None:
            return "not measured yet"
        floor = f" (noise floor {_number(signals.noise.floor)})" if signals.noise is not None else ""
        return _number(signals.best) + floor

    def render(self) -> RenderableType:
        campaign = self.campaign
        state = name_of(campaign_pb2.CampaignState, campaign.state)
        phase = name_of(campaign_pb2.CampaignPhase, campaign.phase)
        title = campaign.spec.title or campaign.spec.brief.goal
        parts: list[RenderableType] = [
            Text.from_markup(f"[bold]{escape(title)}[/]  [dim]{campaign.campaign_id}[/]"),
            Text(f"cycle {campaign.cycle}, {phase} ({state}){': ' + self.status if self.status else ''}"),
            Text(f"best {campaign.spec.metric.name}: {self.best()}"),
        ]
        if self.job is not None:
            job = self.job
            gpus = ", ".join(map(str, job.gpu_indices)) or "none"
            where = job.job.monitor_job_id or json_format.MessageToJson(job.job, indent=None)
            parts.append(Text(f"job {where}: {name_of(monitor_pb2.JobState, job.state)}, GPUs {gpus}"))
            parts.extend(Text(f"  {line[:150]}", style="dim") for line in self.log)
        if self.rows:
            parts.append(ledger_table(self.rows[-_SHOWN_ROWS:], campaign.spec.metric.name))
        parts.extend(Text(note[:160], style="yellow") for note in self.notes)
        return Group(*parts)


async def watch(client: CampaignsClient, campaign_id: str) -> int:
    """Follow the campaign until it ends; Ctrl-C leaves the view (the campaign goes on)."""
    view = CampaignView(await client.get_campaign(campaign_id))

    async def follow(live: Live) -> None:
        async for event in client.stream_campaign(campaign_id):
            view.apply(event)
            live.update(view.render(), refresh=True)

    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    try:
        with Live(view.render(), console=Console(), auto_refresh=False) as live:
            following = asyncio.create_task(follow(live))
            leaving = asyncio.create_task(interrupted.wait())
            await asyncio.wait({following, leaving}, return_when=asyncio.FIRST_COMPLETED)
            leaving.cancel()
            if following.done():
                following.result()  # a failed stream is the command's error
            else:
                following.cancel()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    return 0
