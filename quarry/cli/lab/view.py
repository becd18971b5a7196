"""`quarry lab watch`: the live view folded from a campaign's events, and the ledger table it shares with
`quarry lab ledger`. The best so far is computed with the kernel's signal rules, the campaign's own."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

import grpc
from google.protobuf import json_format
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from quarry.cli.ask import Supervisor, name_of
from quarry.cli.terminal import safe_markup, shown
from quarry.errors import Unavailable
from quarry.records import signals as defaults
from quarry.records.contract import ledger_record
from quarry.records.signals import MetricGoal, SignalRules, read_signals
from quarry.v1 import campaign_pb2, monitor_pb2
from quarry.vocabulary import MetricDirection

_SHOWN_ROWS = 8
_SHOWN_LOG_LINES = 10
# How long `quarry lab watch` waits for a supervisor that went away before it gives up.
AWAY_SECONDS = 600.0
# Narrower than this, the ledger drops its job, commit and token columns and cuts its text shorter.
WIDE_COLUMNS = 110


def number(value: float) -> str:
    return f"{value:.6g}"


def _metric(row: campaign_pb2.LedgerRow, name: str) -> str:
    for metric in row.metrics:
        if metric.name == name:
            return number(metric.value) if metric.HasField("value") else "-"
    return "-"


def ledger_table(rows: Sequence[campaign_pb2.LedgerRow], metric: str, width: int | None = None) -> Table:
    """The ledger's rows; on a terminal narrower than WIDE_COLUMNS, only what a person reads first."""
    if width is not None and width < WIDE_COLUMNS:
        narrow = Table("cycle", "verdict", metric, "hypothesis", expand=True)
        for row in rows:
            narrow.add_row(
                str(row.cycle),
                name_of(campaign_pb2.LedgerVerdict, row.verdict),
                _metric(row, metric),
                shown(row.hypothesis, limit=max(width - 40, 20)),
            )
        return narrow
    table = Table("cycle", "verdict", metric, "job", "commit", "tokens", "hypothesis", "conclusion")
    for row in rows:
        table.add_row(
            str(row.cycle),
            name_of(campaign_pb2.LedgerVerdict, row.verdict),
            _metric(row, metric),
            name_of(monitor_pb2.JobState, row.job_state) if row.job_state else "-",
            shown(row.commit or "-", limit=10),
            str(row.tokens_used),
            shown(row.hypothesis, limit=60),
            shown(row.conclusion, limit=60),
        )
    return table


def signal_inputs(spec: campaign_pb2.CampaignSpec) -> tuple[MetricGoal, SignalRules]:
    """The metric goal and signal rules of a campaign's spec, unset values as the server reads them."""
    maximize = spec.metric.direction == monitor_pb2.METRIC_DIRECTION_MAXIMIZE
    goal = MetricGoal(spec.metric.name, MetricDirection.MAXIMIZE if maximize else MetricDirection.MINIMIZE)
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


@dataclass
class CampaignView:
    """What `quarry lab watch` shows, folded from the campaign's events."""

    campaign: campaign_pb2.Campaign
    status: str = ""
    job: campaign_pb2.CampaignJobProgressEvent | None = None
    log: list[str] = field(default_factory=list)
    rows: list[campaign_pb2.LedgerRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    away: str = ""  # said while the supervisor is away

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
            return number(self.campaign.best_value) if self.campaign.HasField("best_value") else "not measured yet"
        goal, rules = signal_inputs(self.campaign.spec)
        signals = read_signals([ledger_record(row) for row in self.rows], goal, rules)
        if signals.best is None:
            return "not measured yet"
        floor = f" (noise floor {number(signals.noise.floor)})" if signals.noise is not None else ""
        return number(signals.best) + floor

    def render(self, width: int | None = None) -> RenderableType:
        campaign = self.campaign
        state = name_of(campaign_pb2.CampaignState, campaign.state)
        phase = name_of(campaign_pb2.CampaignPhase, campaign.phase)
        title = campaign.spec.title or campaign.spec.brief.goal
        parts: list[RenderableType] = [
            Text.from_markup(f"[bold]{safe_markup(title)}[/]  [dim]{campaign.campaign_id}[/]"),
            shown(f"cycle {campaign.cycle}, {phase} ({state}){': ' + self.status if self.status else ''}"),
            shown(f"best {campaign.spec.metric.name}: {self.best()}"),
        ]
        if self.job is not None:
            job = self.job
            gpus = ", ".join(map(str, job.gpu_indices)) or "none"
            where = job.job.monitor_job_id or json_format.MessageToJson(job.job, indent=None)
            parts.append(shown(f"job {where}: {name_of(monitor_pb2.JobState, job.state)}, GPUs {gpus}"))
            parts.extend(shown(f"  {line}", "dim", limit=152) for line in self.log)
        if self.rows:
            parts.append(ledger_table(self.rows[-_SHOWN_ROWS:], campaign.spec.metric.name, width))
        parts.extend(shown(note, "yellow", limit=160) for note in self.notes)
        if self.away:
            parts.append(Text(self.away, style="bold yellow"))
        return Group(*parts)


async def watch(
    supervisor: Supervisor,
    campaign_id: str,
    *,
    console: Console | None = None,
    away_seconds: float = AWAY_SECONDS,
    retry_seconds: float = 2.0,
) -> int:
    """Follow the campaign until it ends; Ctrl-C leaves the view (the campaign goes on). When the supervisor
    goes away, the view says so and waits for it, finding it again where it now is (a restarted `quarry up`
    may listen on new ports), and goes on after the last event it showed: nothing missed, nothing twice.
    After `away_seconds` without it, the command ends with the way to go on watching."""
    console = console or Console()
    async with supervisor.campaigns() as client:
        view = CampaignView(await client.get_campaign(campaign_id))

    def shown_now() -> RenderableType:
        return view.render(console.width)

    async def follow(live: Live) -> None:
        last, away_since = 0, None
        while True:
            try:
                async with supervisor.current().campaigns() as client:
                    # One re-attach on this address; past it the supervisor is looked for again.
                    events = client.stream_campaign(campaign_id, after_sequence_no=last, max_reconnects=1)
                    async for event in events:
                        view.away, away_since = "", None
                        view.apply(event)
                        last = event.sequence_no
                        live.update(shown_now(), refresh=True)
                return
            except (Unavailable, grpc.aio.AioRpcError) as error:
                if isinstance(error, grpc.aio.AioRpcError) and error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                away_since = away_since if away_since is not None else time.monotonic()
                if time.monotonic() - away_since > away_seconds:
                    raise Unavailable(
                        f"the supervisor stayed away for {away_seconds:g} s; go on watching with "
                        f"quarry lab watch {campaign_id}"
                    ) from None
                view.away = "the supervisor went away; waiting for it (Ctrl-C to stop)"
                live.update(shown_now(), refresh=True)
                await asyncio.sleep(retry_seconds)

    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    try:
        with Live(shown_now(), console=console, auto_refresh=False) as live:
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
