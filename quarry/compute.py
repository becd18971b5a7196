"""The monitor in domain terms: GPUs and jobs as quarry.vocabulary types, over MonitorClient.

A worker's compute tools ask through this, so they hold no protobuf. Nothing here calls a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import grpc

from quarry.clients.monitor import MonitorClient
from quarry.convert import gpu_from_proto, job_look_from_proto, job_ref_to_proto
from quarry.errors import ServiceError
from quarry.vocabulary import Gpu, JobLook, JobRef, MetricPoint

__all__ = ["ComputeView", "JobReport", "MonitorError"]

# The watch's own deadline beyond the wait: the wait ends it first, unless the monitor stops answering.
_WATCH_SLACK_SECONDS = 30.0


class MonitorError(ServiceError):
    """The monitor could not answer; the message says why, in its own words, and `code` is its status."""


@dataclass(frozen=True)
class JobReport:
    """One report of a watched job: how it looks, the log lines and the metric values seen since the last."""

    look: JobLook
    new_log_lines: tuple[str, ...] = ()
    metric_points: tuple[MetricPoint, ...] = ()


class ComputeView:
    def __init__(self, client: MonitorClient) -> None:
        self._client = client

    async def gpus(self, host: str = "") -> tuple[list[Gpu], str]:
        """The GPUs of the monitor's host or a configured SSH host, and the reason when there are none."""
        try:
            response = await self._client.list_gpus(host)
        except grpc.aio.AioRpcError as error:
            raise MonitorError.of(error) from error
        return [gpu_from_proto(gpu) for gpu in response.gpus], response.unavailable_reason

    async def job(self, ref: JobRef, *, log_tail_lines: int = 20) -> JobLook:
        try:
            status = await self._client.job_status(job_ref_to_proto(ref), log_tail_lines=log_tail_lines)
        except grpc.aio.AioRpcError as error:
            raise MonitorError.of(error) from error
        return job_look_from_proto(status)

    async def watch(
        self, ref: JobRef, *, deadline_seconds: float, log_tail_lines: int = 20, poll_seconds: int = 2
    ) -> AsyncGenerator[JobReport]:
        """The job's reports until it ends (a job the monitor started is reported as it changes), or
        `deadline_seconds` pass (a MonitorError then)."""
        watch = self._client.watch_job(
            job_ref_to_proto(ref),
            deadline_seconds=deadline_seconds,
            log_tail_lines=log_tail_lines,
            poll_seconds=poll_seconds,
        )
        try:
            async with contextlib.aclosing(watch):
                async for response in watch:
                    yield JobReport(
                        job_look_from_proto(response.status),
                        tuple(response.new_log_lines),
                        tuple(MetricPoint(p.name, p.value, int(p.step)) for p in response.metric_points),
                    )
        except grpc.aio.AioRpcError as error:
            raise MonitorError.of(error) from error

    async def wait(self, ref: JobRef, *, seconds: float, log_tail_lines: int = 20) -> JobLook:
        """The job once it has ended (with its metrics, for a job the monitor started), or as it is after
        `seconds`; with its last log lines."""
        tail: deque[str] = deque(maxlen=log_tail_lines)
        look: JobLook | None = None
        watch = self.watch(ref, deadline_seconds=seconds + _WATCH_SLACK_SECONDS, log_tail_lines=log_tail_lines)
        async with contextlib.aclosing(watch):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    async for report in watch:
                        tail.extend([*report.look.log_tail, *report.new_log_lines])
                        look = report.look
                        if look.state.ended:
                            break
        if look is None:
            raise MonitorError(
                f"the monitor did not report the job's state within {seconds:g} s",
                code=grpc.StatusCode.DEADLINE_EXCEEDED,
            )
        return dataclasses.replace(look, log_tail=tuple(tail))
