"""An OTLP/gRPC receiver in the test (or benchmark) process, keeping what the services export to it."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass
class Collector(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    """An OTLP/gRPC receiver that keeps what it is sent."""

    traces: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = field(default_factory=list)

    def Export(self, request: Any, context: Any) -> Any:
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            self.traces.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()
        self.metrics.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def spans(self) -> list[tuple[str, trace_pb2.Span]]:
        """(service.name, span) for every span received."""
        found = []
        for request in self.traces:
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"
                )
                for scope_spans in resource_spans.scope_spans:
                    found.extend((service, span) for span in scope_spans.spans)
        return found

    def metric_points(self) -> dict[str, list[dict[str, Any]]]:
        """Metric name -> the attributes of each data point received."""
        points: dict[str, list[dict[str, Any]]] = {}
        for request in self.metrics:
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        data = getattr(metric, metric.WhichOneof("data"))
                        for point in data.data_points:
                            points.setdefault(metric.name, []).append(
                                {a.key: attribute_value(a.value) for a in point.attributes}
                            )
        return points


def attribute_value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def span_attributes(span: Any) -> dict[str, Any]:
    """A received span's attributes, by key."""
    return {a.key: attribute_value(a.value) for a in span.attributes}


@contextmanager
def serving_collector() -> Iterator[tuple[Collector, str]]:
    """The receiver and its OTLP endpoint. On threads of its own: it must answer while the caller blocks
    waiting for services to stop."""
    receiver = Collector()
    server = grpc.server(ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        server.stop(None)
