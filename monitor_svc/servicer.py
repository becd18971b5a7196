"""MonitorService over gRPC: translates quarry.v1 messages to the GPU probes and job watchers and back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import duration_pb2

from monitor_svc.gpus import NvmlProbe
from monitor_svc.jobs import Jobs
from monitor_svc.model import JobObservation
from monitor_svc.smi import APP_QUERY, GPU_QUERY, MalformedOutput, parse_gpus
from monitor_svc.ssh import SshHosts
from monitor_svc.validation import check_job_ref, interval_seconds, require_job_kind, tail_lines
from monitor_svc.workspaces.operations import Workspaces
from monitor_svc.workspaces.rpc import WorkspaceServicer
from quarry.convert import (
    duration_seconds,
    gpu_to_proto,
    job_look_to_proto,
    job_ref_from_proto,
    job_ref_to_proto,
    timestamp,
)
from quarry.errors import ErrorReason, FailedPrecondition
from quarry.v1 import monitor_pb2
from quarry.vocabulary import JobLook

LOCAL = "local"
DEFAULT_GPU_INTERVAL = 5.0
DEFAULT_JOB_INTERVAL = 10.0


def _seconds(value: duration_pb2.Duration, *, has: bool) -> float | None:
    """A Duration field in seconds; None when the request left it unset."""
    return duration_seconds(value) if has else None


def _look(observation: JobObservation, tail: list[str]) -> JobLook:
    return JobLook(observation.state, observation.exit_code, observation.detail, tuple(tail))


class MonitorServicer(WorkspaceServicer):
    """GPUs and jobs here; the workspace RPCs come from WorkspaceServicer."""

    def __init__(self, probe: NvmlProbe, hosts: SshHosts, jobs: Jobs, workspaces: Workspaces) -> None:
        super().__init__(workspaces)
        self._probe = probe
        self._hosts = hosts
        self._jobs = jobs

    async def _gpus(self, host: str) -> tuple[list[monitor_pb2.Gpu], str]:
        """(GPUs, the reason there are none) for this machine or a configured SSH host."""
        if host in ("", LOCAL):
            samples, reason = await self._probe.sample()
            return [gpu_to_proto(replace(sample, host=LOCAL)) for sample in samples], reason
        self._hosts.require(host)
        gpus = await self._hosts.run(host, GPU_QUERY)
        if gpus.exit_status != 0:
            reason = gpus.stderr.strip() or gpus.stdout.strip() or f"exit status {gpus.exit_status}"
            return [], f"nvidia-smi on {host} failed: {reason}"
        apps = await self._hosts.run(host, APP_QUERY)
        try:
            samples = parse_gpus(gpus.stdout, apps.stdout if apps.exit_status == 0 else "")
        except MalformedOutput as error:
            raise FailedPrecondition(
                f"nvidia-smi on {host} printed something unexpected: {error}", reason=ErrorReason.MALFORMED_OUTPUT
            ) from error
        return [gpu_to_proto(replace(sample, host=host)) for sample in samples], ""

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
        kind = require_job_kind(request.WhichOneof("job"), ("local", "slurm"))
        if kind == "local":
            local = request.local
            ref = await self._jobs.submit_local(
                list(local.argv), local.working_directory, local.log_path, request.request_id
            )
        else:
            submission = request.slurm
            ref = await self._jobs.submit_slurm(
                submission.host, submission.script_path, list(submission.sbatch_args), request.request_id
            )
        return monitor_pb2.SubmitJobResponse(job=job_ref_to_proto(ref))

    async def WatchJob(
        self, request: monitor_pb2.WatchJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[monitor_pb2.WatchJobResponse]:
        ref = check_job_ref(job_ref_from_proto(request.job))
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
            yield monitor_pb2.WatchJobResponse(status=status, new_log_lines=[] if first else lines)
            first = False
