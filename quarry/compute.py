"""The monitor in domain terms: GPUs and jobs as quarry.vocabulary types, over MonitorClient.

A worker's compute tools ask through this, so they hold no protobuf. Nothing here calls a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque

import grpc

from quarry.clients.monitor import MonitorClient
from quarry.convert import gpu_from_proto, job_look_from_proto, job_ref_to_proto
from quarry.vocabulary import Gpu, JobLook, JobRef

__all__ = ["ComputeView", "MonitorError"]

# The watch's own deadline beyond the wait: the wait ends it first, unless the monitor stops answering.
_WATCH_SLACK_SECONDS = 30.0


class MonitorError(Exception):
    """The monitor could not answer; the message says why, in its own words."""

    @classmethod
    def of(cls, error: grpc.aio.AioRpcError) -> MonitorError:
        return cls(error.details() or error.code().name)


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

    async def wait(self, ref: JobRef, *, seconds: float, log_tail_lines: int = 20) -> JobLook:
        """The job once it has ended (with its metrics, for a job the monitor started), or as it is after
        `seconds`; with its last log lines."""
        tail: deque[str] = deque(maxlen=log_tail_lines)
        look: JobLook | None = None
        watch = self._client.watch_job(
            job_ref_to_proto(ref), deadline_seconds=seconds + _WATCH_SLACK_SECONDS, log_tail_lines=log_tail_lines
        )
        try:
            async with contextlib.aclosing(watch):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(seconds):
                        async for response in watch:
                            tail.extend([*response.status.log_tail, *response.new_log_lines])
                            look = job_look_from_proto(response.status)
                            if look.state.ended:
                                break
        except grpc.aio.AioRpcError as error:
            raise MonitorError.of(error) from error
        if look is None:
            raise MonitorError(f"the monitor did not report the job's state within {seconds:g} s")
        return dataclasses.replace(look, log_tail=tuple(tail))
