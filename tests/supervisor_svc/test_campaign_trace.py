"""One OpenTelemetry trace per campaign cycle, across the processes, checked at a real OTLP receiver.

The four services run as `quarry serve` processes exporting over OTLP/gRPC to the collector of
tests/fakes/otlp.py. A campaign of two baseline runs and one experiment: the experiment's cycle is one trace,
from the supervisor's THINK (its model call, the engineer's delegation and the worker's tools) through the
job's launch and watch in the monitor to REFLECT, with the campaign and the cycle as attributes; each baseline
run is a trace of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from quarry.clients.campaigns import CampaignsClient
from quarry.clients.channels import open_channel
from quarry.v1 import campaign_pb2
from tests.conftest import TEST_API_KEY
from tests.fakes.openai_server import ScriptedModel
from tests.fakes.otlp import Collector, span_attributes
from tests.supervisor_svc.campaign_lab import BASELINE, BETTER_CONFIG, KEEP, Script, make_project, process_lab, spec

pytestmark = pytest.mark.slow


async def test_each_cycle_is_one_trace_from_think_through_the_monitors_job_to_reflect(
    tmp_path: Path, model: ScriptedModel, collector: tuple[Collector, str]
) -> None:
    receiver, endpoint = collector
    script = Script()
    model.default = script
    script.cycle("Set lr to 0.1 in config.json.", BETTER_CONFIG, "A larger learning rate converges faster.")
    roots = (tmp_path / "roots").resolve()
    project = make_project(roots)
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    async with process_lab(tmp_path, model, roots, otel) as lab:
        address = lab.services["supervisor"].address
        async with open_channel(address, token=TEST_API_KEY) as channel:
            campaigns = CampaignsClient(channel)
            message = spec(project, cycles=3)
            message.signals.CopyFrom(campaign_pb2.CampaignSignalRules(baseline_runs=2))
            campaign = await campaigns.start_campaign(message, request_id="lab-trace")
            stream = [event async for event in campaigns.stream_campaign(campaign.campaign_id)]
    # The processes have stopped (SIGTERM): each flushed its spans on the way out.
    rows = [event.ledger_recorded for event in stream if event.HasField("ledger_recorded")]
    assert [row.verdict for row in rows] == [BASELINE, BASELINE, KEEP], stream[-1]

    spans = receiver.spans()
    by_id = {span.span_id: span for _, span in spans}
    cycles = {span_attributes(span)["quarry.cycle"]: span for _, span in spans if span.name == "campaign cycle"}
    assert sorted(cycles) == [1, 2, 3]
    assert len({span.trace_id for span in cycles.values()}) == 3, "one trace per cycle"
    for number, span in cycles.items():
        seen = span_attributes(span)
        assert seen["quarry.campaign_id"] == campaign.campaign_id and not span.parent_span_id
        assert seen["quarry.cycle.kind"] == ("experiment" if number == 3 else "baseline")

    experiment = cycles[3]
    in_cycle = [(service, span) for service, span in spans if span.trace_id == experiment.trace_id]
    names = {span.name for _, span in in_cycle}
    for expected in (
        "campaign think",
        "chat scripted",
        "delegate",
        "/quarry.v1.WorkerService/Delegate",
        "worker delegation",
        "execute_tool write_file",
        "/quarry.v1.MonitorService/WriteWorkspaceFile",
        "/quarry.v1.MonitorService/CommitWorkspace",
        "campaign experiment",
        "/quarry.v1.MonitorService/SubmitJob",
        "/quarry.v1.MonitorService/WatchJob",
        "campaign reflect",
    ):
        assert expected in names, f"{expected} is not in cycle 3's trace: {sorted(names)}"
    assert {service for service, _ in in_cycle} >= {"quarry-supervisor", "quarry-worker", "quarry-monitor"}

    def root_of(span: trace_pb2.Span) -> trace_pb2.Span:
        while span.parent_span_id:
            assert span.parent_span_id in by_id, f"{span.name}: its parent was never exported"
            span = by_id[span.parent_span_id]
        return span

    assert all(root_of(span).span_id == experiment.span_id for _, span in in_cycle)
    [reflected] = [span for _, span in in_cycle if span.name == "campaign reflect"]
    assert span_attributes(reflected)["quarry.verdict"] == "keep"
    [ran] = [span for _, span in in_cycle if span.name == "campaign experiment"]
    assert span_attributes(ran)["quarry.job_id"] == rows[2].job_id
    # A baseline cycle has no THINK: the job and REFLECT only.
    baseline_names = {span.name for _, span in spans if span.trace_id == cycles[1].trace_id}
    assert "campaign think" not in baseline_names and "/quarry.v1.MonitorService/SubmitJob" in baseline_names
