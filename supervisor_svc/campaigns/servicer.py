"""CampaignService over gRPC: translates quarry.v1 campaign messages to Campaigns calls and back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from quarry.convert import METRIC_DIRECTIONS, duration, duration_seconds, metric_spec_to_proto, timestamp
from quarry.errors import FieldViolation, InvalidArgument
from quarry.records.campaign import CampaignReport
from quarry.records.contract import signals_to_proto
from quarry.records.signals import (
    DEFAULT_BASELINE_RUNS,
    DEFAULT_MAX_RETESTS,
    DEFAULT_NOISE_EPSILON,
    DEFAULT_REBASELINE_EVERY,
    DEFAULT_STAGNATION_WINDOW,
)
from quarry.v1 import campaign_pb2, campaign_pb2_grpc, monitor_pb2
from supervisor_svc.campaigns.events import DIRECTIVE_STATES, PHASES, STATES
from supervisor_svc.campaigns.ledger_reads import ledger_page, standing
from supervisor_svc.campaigns.limiter import DEFAULT_MAX_CONSECUTIVE_FAILURES
from supervisor_svc.campaigns.report import CampaignReports
from supervisor_svc.campaigns.service import Campaigns
from supervisor_svc.campaigns.spec import Brief, Budgets, CampaignSpec, Experiment, Metric, Rules, SlurmBatch, Workspace
from supervisor_svc.campaigns.state import CampaignRecord, DirectiveRecord

# The range a Timestamp may hold (years 1 to 9999).
_MIN_SECONDS, _MAX_SECONDS = -62_135_596_800, 253_402_300_799


def _moment(value: timestamp_pb2.Timestamp, field: str) -> datetime:
    if not (_MIN_SECONDS <= value.seconds <= _MAX_SECONDS and 0 <= value.nanos < 1_000_000_000):
        raise InvalidArgument([FieldViolation(field, "not a valid timestamp")])
    return value.ToDatetime(tzinfo=UTC)


def _optional(message: Any, name: str, default: int) -> int:
    value: int = getattr(message, name) if message.HasField(name) else default
    return value


def spec_from_proto(message: campaign_pb2.CampaignSpec) -> CampaignSpec:
    """The spec as the request gave it (unset numbers as their defaults); validated by Campaigns."""
    brief, workspace, metric = message.brief, message.workspace, message.metric
    experiment, budgets, rules = message.experiment, message.budgets, message.signals
    return CampaignSpec(
        title=message.title,
        brief=Brief(
            goal=brief.goal,
            constraints=tuple(brief.constraints),
            editable_paths=tuple(brief.editable_paths),
            protected_paths=tuple(brief.protected_paths),
        ),
        workspace=Workspace(root=workspace.root, host=workspace.host),
        metric=Metric(
            name=metric.name,
            direction=METRIC_DIRECTIONS.from_proto(metric.direction),
            log_regex=metric.log_regex,
            jsonl_path=metric.jsonl_file.path,
            jsonl_key=metric.jsonl_file.key,
        ),
        experiment=Experiment(
            argv=tuple(experiment.argv),
            command_line=experiment.command_line,
            wall_clock_seconds=(
                duration_seconds(experiment.wall_clock_limit) if experiment.HasField("wall_clock_limit") else None
            ),
            gpu_count=experiment.gpus.count,
            gpu_indices=tuple(experiment.gpus.indices),
            slurm=(
                SlurmBatch(experiment.slurm.script_path, tuple(experiment.slurm.sbatch_args))
                if experiment.HasField("slurm")
                else None
            ),
            isolate_network=experiment.isolate_network,
        ),
        budgets=Budgets(
            tokens_per_hour=budgets.max_tokens_per_hour,
            max_tokens=budgets.max_tokens,
            cycles_per_hour=budgets.max_cycles_per_hour,
            max_cycles=budgets.max_cycles,
            stop_at=_moment(budgets.stop_time, "spec.budgets.stop_time") if budgets.HasField("stop_time") else None,
            max_consecutive_failures=_optional(budgets, "max_consecutive_failures", DEFAULT_MAX_CONSECUTIVE_FAILURES),
        ),
        rules=Rules(
            baseline_runs=rules.baseline_runs or DEFAULT_BASELINE_RUNS,
            rebaseline_every=_optional(rules, "rebaseline_every", DEFAULT_REBASELINE_EVERY),
            stagnation_window=_optional(rules, "stagnation_window", DEFAULT_STAGNATION_WINDOW),
            max_retests=_optional(rules, "max_retests", DEFAULT_MAX_RETESTS),
            noise_epsilon=rules.noise_epsilon or DEFAULT_NOISE_EPSILON,
            phase_gate=rules.phase_gate if rules.HasField("phase_gate") else None,
            stop_at_phase_gate=rules.stop_at_phase_gate,
        ),
        write_report_at_end=message.write_report_at_end,
    )


def spec_to_proto(spec: CampaignSpec) -> campaign_pb2.CampaignSpec:
    """The spec as the campaign keeps it: argv (never command_line), every default spelled out."""
    wanted = spec.metric
    metric = metric_spec_to_proto(
        wanted.name,
        wanted.direction,
        log_regex=wanted.log_regex,
        jsonl_path=wanted.jsonl_path,
        jsonl_key=wanted.jsonl_key,
    )
    experiment = campaign_pb2.CampaignExperiment(
        argv=spec.experiment.argv,
        gpus=monitor_pb2.GpuRequest(count=spec.experiment.gpu_count, indices=spec.experiment.gpu_indices),
        isolate_network=spec.experiment.isolate_network,
    )
    if spec.experiment.wall_clock_seconds is not None:
        experiment.wall_clock_limit.CopyFrom(duration(spec.experiment.wall_clock_seconds))
    if spec.experiment.slurm is not None:
        slurm = spec.experiment.slurm
        experiment.slurm.CopyFrom(
            campaign_pb2.CampaignSlurm(script_path=slurm.script_path, sbatch_args=slurm.sbatch_args)
        )
    budgets = campaign_pb2.CampaignBudgets(
        max_tokens_per_hour=spec.budgets.tokens_per_hour,
        max_tokens=spec.budgets.max_tokens,
        max_cycles_per_hour=spec.budgets.cycles_per_hour,
        max_cycles=spec.budgets.max_cycles,
        max_consecutive_failures=spec.budgets.max_consecutive_failures,
    )
    if spec.budgets.stop_at is not None:
        budgets.stop_time.CopyFrom(timestamp(spec.budgets.stop_at))
    rules = spec.rules
    signals = campaign_pb2.CampaignSignalRules(
        baseline_runs=rules.baseline_runs,
        rebaseline_every=rules.rebaseline_every,
        stagnation_window=rules.stagnation_window,
        max_retests=rules.max_retests,
        noise_epsilon=rules.noise_epsilon,
        stop_at_phase_gate=rules.stop_at_phase_gate,
    )
    if rules.phase_gate is not None:
        signals.phase_gate = rules.phase_gate
    return campaign_pb2.CampaignSpec(
        title=spec.title,
        brief=campaign_pb2.CampaignBrief(
            goal=spec.brief.goal,
            constraints=spec.brief.constraints,
            editable_paths=spec.brief.editable_paths,
            protected_paths=spec.brief.protected_paths,
        ),
        workspace=campaign_pb2.CampaignWorkspace(host=spec.workspace.host, root=spec.workspace.root),
        metric=metric,
        experiment=experiment,
        budgets=budgets,
        signals=signals,
        write_report_at_end=spec.write_report_at_end,
    )


def campaign_to_proto(record: CampaignRecord) -> campaign_pb2.Campaign:
    campaign = campaign_pb2.Campaign(
        campaign_id=record.campaign_id,
        spec=spec_to_proto(record.spec),
        state=STATES.to_proto(record.state),
        phase=PHASES.to_proto(record.phase),
        cycle=record.cycle,
        usage=campaign_pb2.CampaignUsage(
            tokens=record.tokens, tokens_last_hour=record.tokens_last_hour, cycles=record.cycles
        ),
        branch=record.branch,
        scratchpad_thread_id=record.scratchpad_thread_id,
        pause_reason=record.pause_reason,
        end_reason=record.end_reason,
        pending_directives=record.pending_directives,
        last_sequence_no=record.last_sequence_no,
        sleep_reason=record.sleep_reason,
        create_time=timestamp(record.create_time),
        update_time=timestamp(record.update_time),
        created_by=record.created_by,
    )
    if record.best_value is not None:
        campaign.best_value = record.best_value
    if record.noise_floor is not None:
        campaign.noise_floor = record.noise_floor
    if record.sleep_until is not None:
        campaign.sleep_until.CopyFrom(timestamp(record.sleep_until))
    if record.end_time is not None:
        campaign.end_time.CopyFrom(timestamp(record.end_time))
    return campaign


def directive_to_proto(record: DirectiveRecord) -> campaign_pb2.CampaignDirective:
    return campaign_pb2.CampaignDirective(
        campaign_id=record.campaign_id,
        request_id=record.request_id,
        text=record.text,
        state=DIRECTIVE_STATES.to_proto(record.state),
        consumed_cycle=record.consumed_cycle,
        create_time=timestamp(record.create_time),
        sent_by=record.sent_by,
    )


def report_to_proto(campaign_id: str, report: CampaignReport) -> campaign_pb2.CampaignReport:
    return campaign_pb2.CampaignReport(
        campaign_id=campaign_id,
        markdown=report.markdown,
        cycles=report.cycles,
        checked=report.checked,
        problems=report.problems,
        tokens_used=report.tokens_used,
        create_time=timestamp(report.written_at),
    )


class CampaignServicer(campaign_pb2_grpc.CampaignServiceServicer):
    def __init__(self, campaigns: Campaigns, reports: CampaignReports) -> None:
        self._campaigns = campaigns
        self._reports = reports

    async def StartCampaign(
        self, request: campaign_pb2.StartCampaignRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> campaign_pb2.StartCampaignResponse:
        if not request.HasField("spec"):
            raise InvalidArgument([FieldViolation("spec", "required")])
        record = await self._campaigns.start_campaign(spec_from_proto(request.spec), request.request_id)
        return campaign_pb2.StartCampaignResponse(campaign=campaign_to_proto(record))

    async def GetCampaign(
        self, request: campaign_pb2.GetCampaignRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> campaign_pb2.GetCampaignResponse:
        record, signals = await standing(self._campaigns, request.campaign_id)
        campaign = campaign_to_proto(record)
        campaign.signals.CopyFrom(signals_to_proto(signals))
        return campaign_pb2.GetCampaignResponse(campaign=campaign)

    async def ListCampaigns(
        self, request: campaign_pb2.ListCampaignsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> campaign_pb2.ListCampaignsResponse:
        state = STATES.requested(request.state, field="state", enum_name="CampaignState")
        records, token = await self._campaigns.list_campaigns(request.page_size, request.page_token, state)
        return campaign_pb2.ListCampaignsResponse(
            campaigns=[campaign_to_proto(record) for record in records], next_page_token=token
        )

    async def StreamCampaign(
        self, request: campaign_pb2.StreamCampaignRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[campaign_pb2.StreamCampaignResponse]:
        stream = await self._campaigns.events(request.campaign_id, request.after_sequence_no)
        await context.send_initial_metadata(())  # the stream is live: a client may now rely on it
        async for stored in stream:
            yield campaign_pb2.StreamCampaignResponse(event=campaign_pb2.CampaignEvent.FromString(stored.payload))

    async def PauseCampaign(
        self, request: campaign_pb2.PauseCampaignRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> campaign_pb2.PauseCampaignResponse:
        record = await self._campaigns.pause(request.campaign_id, request.reason)
        return campaign_pb2.PauseCampaignResponse(campaign=campaign_to_proto(record))

    async def ResumeCampaign(
        self, request: campaign_pb2.ResumeCampaignRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> campaign_pb2.ResumeCampaignResponse:
        record = await self._campaigns.resume(request.campaign_id, request.reason)
        return campaign_pb2.ResumeCampaignResponse(campaign=campaign_to_proto(record))

    async def StopCampaign(
        self, request: campaign_pb2.StopCampaignRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> campaign_pb2.StopCampaignResponse:
        record = await self._campaigns.stop(request.campaign_id, request.reason)
        self._reports.after_stop(record)
        return campaign_pb2.StopCampaignResponse(campaign=campaign_to_proto(record))

    async def SendDirective(
        self, request: campaign_pb2.SendDirectiveRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> campaign_pb2.SendDirectiveResponse:
        record = await self._campaigns.send_directive(request.campaign_id, request.text, request.request_id)
        return campaign_pb2.SendDirectiveResponse(directive=directive_to_proto(record))

    async def ListLedgerRows(
        self, request: campaign_pb2.ListLedgerRowsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> campaign_pb2.ListLedgerRowsResponse:
        rows, token = await ledger_page(self._campaigns, request.campaign_id, request.page_size, request.page_token)
        return campaign_pb2.ListLedgerRowsResponse(rows=rows, next_page_token=token)

    async def WriteCampaignReport(
        self, request: campaign_pb2.WriteCampaignReportRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> campaign_pb2.WriteCampaignReportResponse:
        report = await self._reports.write(request.campaign_id, request.request_id)
        return campaign_pb2.WriteCampaignReportResponse(report=report_to_proto(request.campaign_id, report))

    async def GetCampaignReport(
        self, request: campaign_pb2.GetCampaignReportRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> campaign_pb2.GetCampaignReportResponse:
        report = await self._reports.latest(request.campaign_id)
        return campaign_pb2.GetCampaignReportResponse(report=report_to_proto(request.campaign_id, report))
