"""The `quarry lab` subcommands: one handler each, over the campaign service's client."""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path

import grpc
from google.protobuf import json_format
from rich.console import Console
from rich.table import Table

from quarry.cli.ask import Supervisor, name_of
from quarry.cli.lab.report import report
from quarry.cli.lab.spec import SpecError, load_settings, settings_from_flags, spec_from_settings, user_name
from quarry.cli.lab.view import ledger_table, number, watch
from quarry.cli.terminal import safe_markup, shown
from quarry.clients.campaigns import CampaignsClient
from quarry.errors import answered_violations
from quarry.v1 import campaign_pb2, monitor_pb2


async def run(args: argparse.Namespace, supervisor: Supervisor) -> int:
    command = args.lab_command
    if command == "start":
        try:
            settings = load_settings(args.file, settings_from_flags(args))
            spec = spec_from_settings(settings)
        except SpecError as error:
            Console(stderr=True).print(f"quarry lab start: {safe_markup(str(error))}", highlight=False)
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
            return await watch(supervisor, args.campaign_id)
        if command == "report":
            return await report(client, args.campaign_id, args.output, new=args.new, request_id=args.request_id)
        output = args.output or Path(f"{args.campaign_id}.png")
        campaign = await client.get_campaign(args.campaign_id)
        plot(campaign, await client.ledger(args.campaign_id), output)
        print(f"wrote {output}")
        return 0


async def start(supervisor: Supervisor, spec: campaign_pb2.CampaignSpec, *, request_id: str, as_json: bool) -> int:
    async with supervisor.campaigns() as client:
        try:
            campaign = await client.start_campaign(spec, request_id=request_id)
        except grpc.aio.AioRpcError as error:
            violations = answered_violations(error) if error.code() is grpc.StatusCode.INVALID_ARGUMENT else []
            if not violations:
                raise
            # Said in the words the campaign was given in: its flags and the campaign file's keys.
            console = Console(stderr=True, highlight=False)
            for violation in violations:
                console.print(f"quarry lab start: {user_name(violation.field)}: {safe_markup(violation.description)}")
            return 2
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
    if not response.campaigns:
        which = f"{state} campaigns" if state else "campaigns"
        print(f"no {which} yet; start one with `quarry lab start campaign.toml` (or flags: `quarry lab start --help`)")
        return 0
    table = Table("state", "phase", "cycle", "best", "created", "title")
    table.add_column("campaign", no_wrap=True)  # whole, so it can be copied into other commands
    for campaign in response.campaigns:
        table.add_row(
            name_of(campaign_pb2.CampaignState, campaign.state),
            name_of(campaign_pb2.CampaignPhase, campaign.phase),
            str(campaign.cycle),
            number(campaign.best_value) if campaign.HasField("best_value") else "",
            campaign.create_time.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"),
            shown(campaign.spec.title or campaign.spec.brief.goal, limit=60),
            campaign.campaign_id,
        )
    Console().print(table)
    return 0


def _budget(used: int, bound: int) -> str:
    return f"{used} of {bound}" if bound else f"{used} (no bound)"


def _experiment(experiment: campaign_pb2.CampaignExperiment) -> str:
    if experiment.HasField("slurm"):
        return " ".join(["sbatch", *experiment.slurm.sbatch_args, experiment.slurm.script_path]) + " (Slurm)"
    return " ".join(experiment.argv)


def _show(console: Console, campaign: campaign_pb2.Campaign) -> None:
    spec = campaign.spec
    console.print(shown(spec.title or spec.brief.goal, "bold"))
    state = name_of(campaign_pb2.CampaignState, campaign.state)
    phase = name_of(campaign_pb2.CampaignPhase, campaign.phase)
    lines = [
        f"{campaign.campaign_id}: {state}, {phase} of cycle {campaign.cycle}"
        + (f", started by {campaign.created_by}" if campaign.created_by else ""),
        f"goal: {spec.brief.goal}",
        f"workspace: {spec.workspace.host or 'the monitor machine'}:{spec.workspace.root}, branch {campaign.branch}",
        f"experiment: {_experiment(spec.experiment)}",
    ]
    direction = name_of(monitor_pb2.MetricDirection, spec.metric.direction)
    best = number(campaign.best_value) if campaign.HasField("best_value") else "not measured yet"
    floor = number(campaign.noise_floor) if campaign.HasField("noise_floor") else "not measured yet"
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
        console.print(shown(line))


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


def _print_ledger(rows: Sequence[campaign_pb2.LedgerRow], campaign: campaign_pb2.Campaign, *, as_jsonl: bool) -> None:
    if as_jsonl:
        for row in rows:
            print(json.dumps(json_format.MessageToDict(row)))
        return
    console = Console()
    console.print(ledger_table(rows, campaign.spec.metric.name, console.width))


def plot(campaign: campaign_pb2.Campaign, rows: Sequence[campaign_pb2.LedgerRow], output: Path) -> None:
    """The campaign's plot as `quarry lab plot` writes it (matplotlib is imported only here: it is slow)."""
    from quarry.cli.lab.plot import plot_ledger

    title = f"{campaign.spec.title or campaign.spec.brief.goal[:60]} ({campaign.campaign_id})"
    plot_ledger(rows, campaign.spec.metric, output, title=title)
