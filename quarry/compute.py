"""The monitor in domain terms: GPUs and jobs as quarry.vocabulary types, over MonitorClient.

A worker's compute tools ask through this, so they hold no protobuf. Nothing here calls a model.
"""

from __future__ import annotations

import grpc

from quarry.client import MonitorClient
from quarry.convert import gpu_from_proto, job_look_from_proto, job_ref_to_proto
from quarry.vocabulary import Gpu, JobLook, JobRef

__all__ = ["ComputeView", "MonitorError"]


class MonitorError(Exception):
    """The monitor could not answer; the message says why, in its own words."""


class ComputeView:
    def __init__(self, client: MonitorClient) -> None:
        self._client = client

    async def gpus(self, host: str = "") -> tuple[list[Gpu], str]:
        """The GPUs of the monitor's host or a configured SSH host, and the reason when there are none."""
        try:
            response = await self._client.list_gpus(host)
        except grpc.aio.AioRpcError as error:
            raise MonitorError(error.details() or error.code().name) from error
        return [gpu_from_proto(gpu) for gpu in response.gpus], response.unavailable_reason

    async def job(self, ref: JobRef, *, log_tail_lines: int = 20) -> JobLook:
        try:
            status = await self._client.job_status(job_ref_to_proto(ref), log_tail_lines=log_tail_lines)
        except grpc.aio.AioRpcError as error:
            raise MonitorError(error.details() or error.code().name) from error
        return job_look_from_proto(status)
