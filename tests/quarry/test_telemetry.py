"""OpenTelemetry across the mesh: one trace from StartRun to every scratchpad append, metrics, logs, no secrets.

The services run as real processes exporting over OTLP/gRPC to a receiver in
this test process (the collector's own TraceService and MetricsService from
opentelemetry-proto), so the exporters, the propagation between processes and
the flush at shutdown are all the real ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from quarry.clients.channels import insecure_channel
from quarry.clients.runs import RunsClient
from quarry.clients.scratchpad import ScratchpadClient
from quarry.telemetry import JsonFormatter
from quarry.v1 import common_pb2, scratchpad_pb2
from tests.conftest import reusable_port, start_service, stop_service
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography, append_finding
from tests.fakes.openai_server import Call, DropAfter, Reply, ScriptedModel
from tests.fakes.otlp import Collector, span_attributes
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.conftest import processes

SECRET = "sk-quarry-test-secret-7f3a9c"


@pytest.mark.slow
async def test_one_trace_from_start_run_to_every_scratchpad_append(
    tmp_path: Path, model: ScriptedModel, site: FixtureWeb, collector: tuple[Collector, str]
) -> None:
    receiver, endpoint = collector
    script = Choreography()
    model.default = script
    article = f"{site.base_url}/article.html"
    task = "Find the height of the tower."
    script.add(
        task,
        Reply(
            calls=(
                Call("read_scratchpad", {}, "w-read"),
                Call("read_web_page", {"url": article}, "w-page"),
                Call("read_web_page", {"url": "http://10.0.0.1/admin"}, "w-refused"),  # an error result
            )
        ),
        Reply(
            calls=(
                append_finding("w-append", "The tower is 330 metres tall.", article, "The tower is 330 metres tall"),
            )
        ),
        Reply(content="Promoted the height."),
    )
    script.add("Find the colour.", DropAfter("The colour is"))  # the provider fails mid-stream
    script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": task}, "s-delegate"),)),
        Reply(calls=(Call("delegate_research", {"objective": "Find the colour."}, "s-failing"),)),
        Reply(calls=(Call("append_scratchpad", {"kind": "note", "content": "Height found."}, "s-note"),)),
        Reply(content="Done."),
    )
    script.add(REPORT, Reply(content="The tower is 330 metres tall [1]."))
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "QUARRY_TRACE_SQL": "true",  # statement and HTTP spans are opt-in
        "QUARRY_TRACE_HTTP": "true",
        "QUARRY_MODEL_API_KEY": SECRET,
        "QUARRY_LOG_LEVEL": "INFO",
    }
    with processes(tmp_path, model, site, env) as mesh:
        async with RunsClient.connect(mesh.supervisor.address) as client:
            run = await client.start_run("How tall is the tower?")
            events = [event async for event in client.stream_run(run.run_id)]
        assert events[-1].HasField("completed"), events[-1]
        services = [mesh.supervisor, *mesh.workers, mesh.scratchpad]
    # The processes have stopped (SIGTERM): each flushed its spans and metrics on the way out.
    logs = "\n".join(service.log() for service in services)

    spans = receiver.spans()
    by_id = {span.span_id: (service, span) for service, span in spans}
    [(_, start)] = [(s, span) for s, span in spans if span.name == "/quarry.v1.SupervisorService/StartRun"]
    trace_id = start.trace_id
    in_run = [(service, span) for service, span in spans if span.trace_id == trace_id]

    def ancestors(span: trace_pb2.Span) -> list[str]:
        names = []
        while span.parent_span_id:
            assert span.parent_span_id in by_id, f"{span.name}: its parent was never exported"
            span = by_id[span.parent_span_id][1]
            names.append(span.name)
        return names

    names = {span.name for _, span in in_run}
    for expected in (
        "research run",
        "supervisor turn",
        "delegate",
        "/quarry.v1.WorkerService/Delegate",
        "worker delegation",
        "worker turn",
        "chat scripted",
        "execute_tool append_scratchpad",
        "execute_tool read_web_page",
        "/quarry.v1.ScratchpadService/Append",
        "scratchpad append",
    ):
        assert expected in names, f"{expected} is not in the run's trace: {sorted(names)}"
    assert {service for service, _ in in_run} == {"quarry-supervisor", "quarry-worker", "quarry-scratchpad"}
    # Every span of the run is in the one trace, each with its parent present.
    for name in ("research run", "delegate", "worker delegation", "scratchpad append"):
        assert all(span.trace_id == trace_id for _, span in spans if span.name == name), name
    for _, span in in_run:
        if span.span_id != start.span_id:
            assert ancestors(span)[-1] == start.name, span.name
    assert not any("grpc.health.v1" in span.name for _, span in spans), "health checks are not traced"

    for _, span in in_run:
        chain = ancestors(span)
        if span.name == "delegate":
            assert chain[:2] == ["execute_tool delegate_research", "supervisor turn"], chain
        if span.name == "worker turn":
            assert "worker delegation" in chain and "delegate" in chain, chain
        if span.name.startswith(("execute_tool", "chat")) and "worker delegation" in chain:
            assert chain[0] == "worker turn", (span.name, chain)
        kind = span_attributes(span).get("quarry.entry.kind") if span.name == "scratchpad append" else None
        if kind in ("assignment", "route", "usage"):  # the supervisor's ledger of the delegation
            assert "delegate" in chain, chain
        elif kind is not None and kind != "seed":
            assert "execute_tool append_scratchpad" in chain, chain
    statements = [span for _, span in in_run if is_statement(span)]
    assert statements, "SQLAlchemy statements are traced when asked for"
    assert any("scratchpad append" in ancestors(span) for span in statements), "an append's own statements"
    appends = [span for _, span in in_run if span.name == "scratchpad append"]
    kinds = sorted(span_attributes(s)["quarry.entry.kind"] for s in appends)
    assert set(kinds) == {"seed", "assignment", "route", "finding", "usage", "note"}, kinds
    assert kinds.count("assignment") == kinds.count("route") == kinds.count("usage"), kinds
    assert sorted(span_attributes(s)["quarry.sequence_no"] for s in appends) == list(range(1, len(appends) + 1))
    assert all(span_attributes(s)["quarry.thread_id"] == run.scratchpad_thread_id for s in appends)

    chats = [span for _, span in in_run if span.name == "chat scripted"]
    assert len(chats) == 9  # four supervisor turns, three + one worker turns, the report
    [broken] = [chat for chat in chats if chat.status.code == trace_pb2.Status.STATUS_CODE_ERROR]
    assert "ProviderError" in broken.status.message and [e.name for e in broken.events] == ["exception"]
    chats.remove(broken)
    for chat in chats:
        seen = span_attributes(chat)
        assert seen["gen_ai.operation.name"] == "chat" and seen["gen_ai.request.model"] == "scripted"
        assert seen["gen_ai.usage.input_tokens"] == 10 and seen["gen_ai.usage.output_tokens"] == 5
        assert seen["gen_ai.response.finish_reasons"]
    # With QUARRY_TRACE_HTTP, each model call's HTTP request is a span under its chat span.
    requests = [span for _, span in in_run if span.name == "POST"]
    assert {span.parent_span_id for span in requests} == {chat.span_id for chat in [*chats, broken]}
    tool = next(span for _, span in in_run if span.name == "execute_tool append_scratchpad")
    assert span_attributes(tool)["gen_ai.tool.call.id"] in ("w-append", "s-note")
    assert span_attributes(tool)["quarry.tool.outcome"] == "ok"
    delegations = {span_attributes(s)["quarry.delegation.outcome"]: s for _, s in in_run if s.name == "delegate"}
    assert set(delegations) == {"succeeded", "provider_error"}
    assert delegations["provider_error"].status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert delegations["succeeded"].status.code != trace_pb2.Status.STATUS_CODE_ERROR
    [refused] = [s for _, s in in_run if span_attributes(s).get("gen_ai.tool.call.id") == "w-refused"]
    assert refused.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert span_attributes(refused)["quarry.tool.outcome"] == "error"

    points = receiver.metric_points()
    assert any(p["rpc.method"] == "/quarry.v1.SupervisorService/StartRun" for p in points["rpc.server.duration"])
    outcomes = {p["quarry.delegation.outcome"] for p in points["quarry.delegations"]}
    assert outcomes == {"succeeded", "provider_error"}
    tiers = {(p["quarry.tier"], p["gen_ai.token.type"]) for p in points["quarry.tokens"]}
    assert tiers == {("supervisor", "input"), ("supervisor", "output"), ("worker", "input"), ("worker", "output")}
    assert {p["quarry.entry.kind"] for p in points["quarry.scratchpad.appends"]} == {
        *("seed", "finding", "note"),
        *("assignment", "route", "usage"),
    }
    assert "quarry.delegations.active" in points

    # Logs are JSON with the trace they belong to; the API key appears nowhere.
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    [ended] = [line for line in lines if line["message"] == f"run {run.run_id} succeeded"]
    assert ended["trace_id"] == trace_id.hex() and ended["service"] == "supervisor"
    exported = b"".join(request.SerializeToString() for request in receiver.traces)
    assert SECRET.encode() not in exported and b"Bearer" not in exported
    assert SECRET not in logs and "Bearer" not in logs


def is_statement(span: trace_pb2.Span) -> bool:
    return any(key in span_attributes(span) for key in ("db.system", "db.system.name"))


@pytest.mark.slow
@pytest.mark.parametrize("trace_sql", [None, "true"])
async def test_sql_statement_spans_only_when_asked_for(
    tmp_path: Path, collector: tuple[Collector, str], trace_sql: str | None
) -> None:
    receiver, endpoint = collector
    env = {
        "QUARRY_DATA_DIR": str(tmp_path),
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        **({"QUARRY_TRACE_SQL": trace_sql} if trace_sql else {}),
    }
    service = start_service("scratchpad", env, tmp_path)
    try:
        async with insecure_channel(service.address) as channel:
            client = ScratchpadClient(channel)
            thread = await client.create_thread(title="statements")
            await client.append(
                thread.thread_id,
                kind=scratchpad_pb2.ENTRY_KIND_NOTE,
                author=common_pb2.Principal(principal_id="me", role=common_pb2.ROLE_RESEARCHER),
                content="traced",
            )
    finally:
        stop_service(service)  # flushes the spans
    spans = [span for _, span in receiver.spans()]
    [append] = [span for span in spans if span.name == "scratchpad append"]
    [served] = [span for span in spans if span.name == "/quarry.v1.ScratchpadService/Append"]
    assert append.parent_span_id == served.span_id and append.trace_id == served.trace_id
    statements = [span for span in spans if is_statement(span)]
    if trace_sql:
        assert any(span.parent_span_id == append.span_id for span in statements), "the append's own statements"
    else:
        assert statements == [], [span.name for span in statements]


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@pytest.mark.slow
async def test_a_service_serves_its_metrics_for_prometheus(tmp_path: Path) -> None:
    port = reusable_port()
    service = start_service(
        "scratchpad",
        {"QUARRY_DATA_DIR": str(tmp_path), "QUARRY_SCRATCHPAD_PROMETHEUS_ADDRESS": f"127.0.0.1:{port}"},
        tmp_path,
    )
    try:
        async with insecure_channel(service.address) as channel:
            client = ScratchpadClient(channel)
            thread = await client.create_thread(title="metrics")
            await client.append(
                thread.thread_id,
                kind=scratchpad_pb2.ENTRY_KIND_NOTE,
                author=common_pb2.Principal(principal_id="me", role=common_pb2.ROLE_RESEARCHER),
                content="counted",
            )
        text = await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/metrics")
    finally:
        stop_service(service)
    [appends] = [line for line in text.splitlines() if line.startswith("quarry_scratchpad_appends_total{")]
    assert 'quarry_entry_kind="note"' in appends and 'quarry_replayed="false"' in appends
    assert appends.endswith(" 1.0")
    assert 'rpc_method="/quarry.v1.ScratchpadService/Append"' in text


def test_log_lines_carry_the_trace_and_mask_secrets() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    formatter = JsonFormatter("worker", secrets=[SECRET])
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("work") as span:
        record = logging.LogRecord(
            "quarry.test",
            logging.INFO,
            __file__,
            1,
            "calling with %s and Authorization: Bearer abc.def",
            (SECRET,),
            None,
        )
        line = json.loads(formatter.format(record))
    context = span.get_span_context()
    assert line["trace_id"] == format(context.trace_id, "032x") and line["span_id"] == format(context.span_id, "016x")
    assert SECRET not in line["message"] and "abc.def" not in line["message"]
    quoted = logging.LogRecord("quarry.test", logging.WARNING, __file__, 1, '{"api_key": "sk-other-123"}', (), None)
    assert "sk-other-123" not in formatter.format(quoted), "masked before JSON escapes the quotes"
    assert line["service"] == "worker" and line["level"] == "INFO"
