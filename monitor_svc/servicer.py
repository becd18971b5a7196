"""MonitorService over gRPC: translates quarry.v1 messages to the GPU probes and job watchers and back
(the workspace RPCs: monitor_svc/workspaces/rpc.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import duration_pb2

from monitor_svc.gpus import GpuRequest, GpuSampler
from monitor_svc.jobs import BatchScript, Command, JobKind, JobObservation, JobOptions, JobRequest, Jobs
from monitor_svc.metrics import MetricPoint, MetricResult, MetricSpec
from monitor_svc.ssh import SshHosts
from monitor_svc.validation import check_monitor_job_id, interval_seconds, require_job_kind, tail_lines
from monitor_svc.workspaces.operations import Workspaces
from monitor_svc.workspaces.rpc import WorkspaceServicer
from quarry.convert import (
    METRIC_DIRECTIONS,
    duration_seconds,
    gpu_to_proto,
    job_look_to_proto,
    job_ref_from_proto,
    job_ref_to_proto,
    timestamp,
)
from quarry.v1 import monitor_pb2
from quarry.vocabulary import JobLook

DEFAULT_GPU_INTERVAL = 5.0
DEFAULT_JOB_INTERVAL = 10.0


def _seconds(value: duration_pb2.Duration, *, has: bool) -> float | None:
    """A Duration field in seconds; None when the request left it unset."""
    return duration_seconds(value) if has else None


def _look(observation: JobObservation, tail: list[str]) -> JobLook:
    return JobLook(observation.state, observation.exit_code, observation.detail, tuple(tail))


def _options(message: monitor_pb2.JobOptions) -> JobOptions:
    return JobOptions(
        environment=dict(message.environment),
        wall_clock_limit=_seconds(message.wall_clock_limit, has=message.HasField("wall_clock_limit")),
        gpus=GpuRequest(message.gpus.count, tuple(message.gpus.indices)),
        metrics=tuple(_metric_spec(spec) for spec in message.metrics),
        workspace_id=message.workspace_id,
        isolate_network=message.isolate_network,
    )


def _metric_spec(message: monitor_pb2.MetricSpec) -> MetricSpec:
    jsonl = message.jsonl_file
    return MetricSpec(
        message.name,
        METRIC_DIRECTIONS.from_proto(message.direction),
        log_regex=message.log_regex,
        jsonl_path=jsonl.path,
        jsonl_key=jsonl.key,
    )


def _metric_result(result: MetricResult) -> monitor_pb2.MetricResult:
    return monitor_pb2.MetricResult(
        name=result.name,
        direction=METRIC_DIRECTIONS.to_proto(result.direction),
        state=monitor_pb2.METRIC_STATE_FOUND if result.found else monitor_pb2.METRIC_STATE_NOT_FOUND,
        value=result.value or 0.0,
        best=result.best or 0.0,
        count=result.count,
        detail=result.detail,
    )


def _metric_point(point: MetricPoint) -> monitor_pb2.MetricPoint:
    return monitor_pb2.MetricPoint(name=point.name, value=point.value, step=point.step)


def _command(message: monitor_pb2.LocalCommand | monitor_pb2.RemoteCommand, host: str = "") -> Command:
    return Command(
        argv=tuple(message.argv),
        command_line=message.command_line,
        working_directory=message.working_directory,
        log_path=message.log_path,
        host=host,
    )


class MonitorServicer(WorkspaceServicer):
    """GPUs and jobs here; the workspace RPCs come from WorkspaceServicer."""

    def __init__(self, gpus: GpuSampler, hosts: SshHosts, jobs: Jobs, workspaces: Workspaces) -> None:
        super().__init__(workspaces)
        self._gpu_sampler = gpus
        self._hosts = hosts
        self._jobs = jobs

    async def _gpus(self, host: str) -> tuple[list[monitor_pb2.Gpu], str]:
        """(GPUs, the reason there are none) for this machine or a configured SSH host."""
        samples, reason = await self._gpu_sampler.sample(host)
        return [gpu_to_proto(sample) for sample in samples], reason

    async def ListGpus(
        self, request: monitor_pb2.ListGpusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> monitor_pb2.ListGpusResponse:
        gpus, reason = await self._gpus(request.host)
        return monitor_pb2.ListGpusResponse(
            gpus=gpus, sample_time=timestamp(datetime.now(UTC)), unavailable_reason=reason
        )

    async def WatchGpus(
        self, request: monitor_pb2.WatchGpusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[monitor_pb2.WatchGpusResponse]:
        interval = interval_seconds(
            _seconds(request.interval, has=request.HasField("interval")),
            "interval",
            default=DEFAULT_GPU_INTERVAL,
            minimum=1.0,
        )
        while True:  # until the client goes away or the server stops
            gpus, reason = await self._gpus(request.host)
            yield monitor_pb2.WatchGpusResponse(
                gpus=gpus, sample_time=timestamp(datetime.now(UTC)), unavailable_reason=reason
            )
            await asyncio.sleep(interval)

    async def SubmitJob(
        self, request: monitor_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> monitor_pb2.SubmitJobResponse:
        kind = JobKind(require_job_kind(request.WhichOneof("job"), tuple(JobKind)))
        job: JobRequest
        if kind is JobKind.LOCAL:
            job = _command(request.local)
        elif kind is JobKind.REMOTE:
            job = _command(request.remote, request.remote.host)
        else:
            slurm = request.slurm
            job = BatchScript(slurm.host, slurm.script_path, tuple(slurm.sbatch_args))
        record = await self._jobs.submit(kind, job, _options(request.options), request.request_id)
        return monitor_pb2.SubmitJobResponse(job=job_ref_to_proto(record.ref), gpu_indices=record.gpus)

    async def WatchJob(
        self, request: monitor_pb2.WatchJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[monitor_pb2.WatchJobResponse]:
        ref = job_ref_from_proto(request.job)
        if ref.monitor_job_id:
            check_monitor_job_id(ref)
        if ref.kind or not ref.monitor_job_id:  # a job the monitor started may be named by its id alone
            self._jobs.check_ref(ref)
            if ref.host:
                self._hosts.require(ref.host, field=f"job.{ref.kind}.host")
        interval = interval_seconds(
            _seconds(request.poll_interval, has=request.HasField("poll_interval")),
            "poll_interval",
            default=DEFAULT_JOB_INTERVAL,
            minimum=1.0,
        )
        lines_wanted = tail_lines(request.log_tail_lines)
        first = True
        async for observation in self._jobs.watch(ref, interval, lines_wanted):
            lines = list(observation.new_log_lines)
            status = job_look_to_proto(_look(observation, lines if first else []))
            status.metrics.extend(_metric_result(result) for result in observation.metrics)
            yield monitor_pb2.WatchJobResponse(
                status=status,
                new_log_lines=[] if first else lines,
                metric_points=[_metric_point(point) for point in observation.metric_points],
            )
            first = False
