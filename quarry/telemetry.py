"""OpenTelemetry for every service: traces, metrics and trace-correlated logs.

Configured from the standard OTEL_* variables: spans and metrics are exported
over OTLP/gRPC when an endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT, or the
per-signal ..._TRACES_ENDPOINT / ..._METRICS_ENDPOINT), and nothing is
exported otherwise; OTEL_SDK_DISABLED=true turns everything off. gRPC calls
(client and server, health checks excluded) are traced by Quarry's own
interceptors through `client_span` and `server_span`; httpx and SQLAlchemy
are instrumented with the official packages when QUARRY_TRACE_HTTP and
QUARRY_TRACE_SQL ask for a span per request and per statement. Code records its own spans and metrics through
`tracer` and `meter` here; both are no-ops until `setup` installs providers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled, suppress_instrumentation

__all__ = [
    "JsonFormatter",
    "Telemetry",
    "client_span",
    "meter",
    "quiet",
    "record_failure",
    "server_span",
    "set_rpc_status",
    "setup",
    "tracer",
    "traces_rpcs",
    "tracing_enabled",
]

tracer = trace.get_tracer("quarry")
meter = metrics.get_meter("quarry")

_TRUE = {"1", "true", "yes", "on"}


def _sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE


def _exports(signal: str) -> bool:
    """Whether OTLP export of a signal ("traces" or "metrics") is configured."""
    if _sdk_disabled() or os.environ.get(f"OTEL_{signal.upper()}_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    )


_tracing = False


def tracing_enabled() -> bool:
    """True once `setup` installed a tracer provider that exports."""
    return _tracing


@dataclass
class Telemetry:
    """What `setup` installed; `shutdown` flushes what is pending (call it after the service stops)."""

    providers: list[Any] = field(default_factory=list)

    def shutdown(self) -> None:
        for provider in self.providers:
            try:
                provider.shutdown()
            except Exception:  # one failing exporter must not keep the other's data from being flushed
                logging.getLogger(__name__).exception("telemetry shutdown failed")


def setup(
    service_name: str, *, prometheus_address: str = "", trace_sql: bool = False, trace_http: bool = False
) -> Telemetry:
    """Install providers and instrumentations for this process, from the OTEL_* environment; `trace_sql`
    adds a span per SQL statement (QUARRY_TRACE_SQL), `trace_http` one per HTTP request (QUARRY_TRACE_HTTP)."""
    global _tracing, _traced_rpcs
    telemetry = Telemetry()
    if _sdk_disabled():
        return telemetry
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    # OTEL_SERVICE_NAME, when set, wins; otherwise each service names itself.
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: f"quarry-{service_name}"}
    resource = Resource.create(attributes)
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc").strip().lower()
    if protocol != "grpc":
        from quarry.config import ConfigurationError

        raise ConfigurationError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: Quarry exports OTLP over gRPC only (the collector's port 4317)"
        )
    if _exports("traces"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(tracer_provider)
        telemetry.providers.append(tracer_provider)
        _tracing = True
        _traced_rpcs = "grpc" not in _disabled_instrumentations()
        _instrument_libraries(trace_sql=trace_sql, trace_http=trace_http)
    readers: list[Any] = []
    if _exports("metrics"):
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if prometheus_address:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        host, _, port = prometheus_address.rpartition(":")
        start_http_server(int(port), addr=host or "0.0.0.0")
        readers.append(PrometheusMetricReader())
    if readers:
        from opentelemetry.sdk.metrics import MeterProvider

        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        telemetry.providers.append(meter_provider)
    return telemetry


def _disabled_instrumentations() -> set[str]:
    """OTEL_PYTHON_DISABLED_INSTRUMENTATIONS, as the auto-instrumentation reads it (e.g. "sqlalchemy,httpx")."""
    names = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    return {name.strip().lower() for name in names.split(",") if name.strip()}


def _instrument_libraries(*, trace_sql: bool, trace_http: bool) -> None:
    from opentelemetry.metrics import NoOpMeterProvider

    disabled = _disabled_instrumentations()
    # Spans only: their metrics would be labelled by every host a worker reads (httpx) or drift while
    # housekeeping is untraced (SQLAlchemy's pool counts). Quarry's own metrics cover the rest.
    no_metrics = NoOpMeterProvider()
    # HTTP and statement spans are opt-in. A POST span under each model call repeats its `chat` span, and
    # without httpx's instrumentation tracing's CPU overhead fell from about +17% to +6% (bench/tracing.py);
    # statement spans were most of a run's spans, and an instrumented engine takes statements off
    # quarry.db.Prepared's fast path.
    if trace_http and "httpx" not in disabled:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor().instrument(meter_provider=no_metrics)
    if trace_sql and "sqlalchemy" not in disabled:
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

        # It declares SQLAlchemy < 2.1; its event hooks work on 2.1 (the trace test shows the statements).
        SQLAlchemyInstrumentor().instrument(enable_commenter=False, skip_dep_check=True, meter_provider=no_metrics)
        # Without its "connect" span per pool checkout, which doubles the spans for nothing an operator
        # reads (measured: 3,845 -> 2,945 spans and about half the overhead in bench/tracing.py).
        import sqlalchemy.engine.base
        from opentelemetry.instrumentation.utils import unwrap

        unwrap(sqlalchemy.engine.base.Engine, "connect")


# Quarry traces its RPCs in the interceptors it runs anyway (quarry.interceptors on servers, the bearer
# token's on clients): the official gRPC instrumentation's own layer, a handler rebuilt per call and a
# proxy around every servicer context, cost more than all of Quarry's other spans (bench/tracing.py).
_HEALTH_CHECKS = "/grpc.health.v1."
_traced_rpcs = False


def traces_rpcs(method: str) -> bool:
    """Whether calls of `method` get spans: tracing is on for gRPC, and it is no health check."""
    return _traced_rpcs and not method.startswith(_HEALTH_CHECKS)


def _rpc_attributes(method: str) -> dict[str, str]:
    service, _, name = method.lstrip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


@contextlib.contextmanager
def server_span(method: str, metadata: Iterable[tuple[str, str | bytes]] | None) -> Iterator[trace.Span]:
    """The SERVER span of one call, in the trace the caller's metadata carries (W3C traceparent)."""
    carrier = {key: value for key, value in metadata or () if isinstance(value, str)}
    with tracer.start_as_current_span(
        method,
        context=propagate.extract(carrier),
        kind=trace.SpanKind.SERVER,
        attributes=_rpc_attributes(method),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def client_span(method: str | bytes) -> tuple[trace.Span, list[tuple[str, str]]] | None:
    """A CLIENT span for one call and the metadata that carries its trace; None when untraced (quiet())."""
    if isinstance(method, bytes):  # what grpc.aio hands client interceptors (grpc/grpc#31092)
        method = method.decode()
    if not traces_rpcs(method) or not is_instrumentation_enabled():
        return None
    span = tracer.start_span(method, kind=trace.SpanKind.CLIENT, attributes=_rpc_attributes(method))
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return span, list(carrier.items())


def set_rpc_status(span: trace.Span, code: Any, details: str | None = None) -> None:
    """An RPC span's grpc.StatusCode (an error status unless OK)."""
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code.value[0] != 0:
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{code.name}: {details or ''}"))


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Housekeeping (lease renewal, polling) that should not fill traces with spans."""
    with suppress_instrumentation():
        yield


def record_failure(span: trace.Span, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))


# Secrets that must never reach a log line, whatever a library puts in its messages.
_SECRET = re.compile(r"(?i)(authorization[\"'=:\s]+(?:bearer\s+|basic\s+)?|bearer\s+|api[_-]?key[\"'=:\s]+)[^\s\"',;]+")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the current trace_id and span_id, and secrets masked.

    `text=True` gives the same fields as one readable line, for a terminal.
    """

    def __init__(self, service: str, secrets: Sequence[str] = (), *, text: bool = False) -> None:
        super().__init__()
        self._service = service
        self._secrets = [secret for secret in secrets if len(secret) >= 6]
        self._text = text

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "service": self._service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            entry["trace_id"] = format(context.trace_id, "032x")
            entry["span_id"] = format(context.span_id, "016x")
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # Masked before JSON encoding, which would escape the quotes the patterns look for.
        for key in ("message", "exception"):
            if key in entry:
                entry[key] = self.mask(entry[key])
        if self._text:
            ids = f" trace={entry['trace_id']} span={entry['span_id']}" if "trace_id" in entry else ""
            line = f"{entry['time']} {self._service} {record.levelname} {record.name}:{ids} {entry['message']}"
            return self.mask(line + (f"\n{entry['exception']}" if "exception" in entry else ""))
        return self.mask(json.dumps(entry, ensure_ascii=False))

    def mask(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _SECRET.sub(lambda match: match.group(1) + "***", text)
