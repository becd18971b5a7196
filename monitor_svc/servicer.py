"""MonitorService over gRPC. GPUs of this host for now; SSH hosts, Slurm and jobs are not built yet
(SubmitJob and WatchJob answer UNIMPLEMENTED)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import grpc

from monitor_svc.gpus import GpuSample, NvmlProbe
from quarry.convert import timestamp
from quarry.errors import FieldViolation, InvalidArgument, Unimplemented
from quarry.v1 import monitor_pb2, monitor_pb2_grpc

MIN_INTERVAL_SECONDS = 0.1
DEFAULT_INTERVAL_SECONDS = 5.0


def gpu_to_proto(sample: GpuSample) -> monitor_pb2.Gpu:
    return monitor_pb2.Gpu(
        index=sample.index,
        uuid=sample.uuid,
        name=sample.name,
        memory_total_bytes=sample.memory_total_bytes,
        memory_used_bytes=sample.memory_used_bytes,
        utilization_percent=sample.utilization_percent,
        temperature_celsius=sample.temperature_celsius,
        power_watts=sample.power_watts,
        processes=[
            monitor_pb2.GpuProcess(pid=p.pid, used_memory_bytes=p.used_memory_bytes, name=p.name)
            for p in sample.processes
        ],
    )


def _local_only(host: str) -> None:
    if host:
        raise InvalidArgument([FieldViolation("host", "only this host is monitored so far; leave host empty")])


class MonitorServicer(monitor_pb2_grpc.MonitorServiceServicer):
    def __init__(self, probe: NvmlProbe) -> None:
        self._probe = probe

    async def _sample(self) -> tuple[list[monitor_pb2.Gpu], Any]:
        gpus = [gpu_to_proto(sample) for sample in await self._probe.sample()]
        return gpus, timestamp(datetime.now(UTC))

    async def ListGpus(
        self, request: monitor_pb2.ListGpusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> monitor_pb2.ListGpusResponse:
        _local_only(request.host)
        gpus, when = await self._sample()
        return monitor_pb2.ListGpusResponse(
            gpus=gpus, sample_time=when, unavailable_reason=self._probe.unavailable_reason
        )

    async def WatchGpus(
        self, request: monitor_pb2.WatchGpusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[monitor_pb2.WatchGpusResponse]:
        _local_only(request.host)
        interval = DEFAULT_INTERVAL_SECONDS
        if request.HasField("interval"):
            interval = request.interval.seconds + request.interval.nanos / 1e9
            if not MIN_INTERVAL_SECONDS <= interval <= 3600:
                raise InvalidArgument([FieldViolation("interval", "between 0.1 s and 1 hour")])
        while True:  # until the client goes away or the server stops
            gpus, when = await self._sample()
            yield monitor_pb2.WatchGpusResponse(
                gpus=gpus, sample_time=when, unavailable_reason=self._probe.unavailable_reason
            )
            await asyncio.sleep(interval)

    async def SubmitJob(
        self, request: monitor_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> monitor_pb2.SubmitJobResponse:
        raise Unimplemented("job submission is not built yet", reason="JOBS_NOT_BUILT")

    async def WatchJob(
        self, request: monitor_pb2.WatchJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[monitor_pb2.WatchJobResponse]:
        raise Unimplemented("job watching is not built yet", reason="JOBS_NOT_BUILT")
        yield  # a server stream
