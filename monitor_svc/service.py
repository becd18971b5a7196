"""Assembles the monitor process: NVML probe, servicer, host."""

from __future__ import annotations

import grpc

from monitor_svc.gpus import NvmlProbe
from monitor_svc.servicer import MonitorServicer
from quarry.config import MonitorSettings, QuarrySettings
from quarry.server import ServiceHost, ServiceRegistration
from quarry.v1 import monitor_pb2, monitor_pb2_grpc

SERVICE_NAME = monitor_pb2.DESCRIPTOR.services_by_name["MonitorService"].full_name


async def build_host(settings: MonitorSettings | None = None, common: QuarrySettings | None = None) -> ServiceHost:
    settings = settings or MonitorSettings()
    common = common or QuarrySettings()
    probe = NvmlProbe()

    def register(server: grpc.aio.Server) -> None:
        monitor_pb2_grpc.add_MonitorServiceServicer_to_server(MonitorServicer(probe), server)

    async def release() -> None:
        probe.close()

    return ServiceHost(
        settings.address,
        [ServiceRegistration(SERVICE_NAME, register)],
        grace=common.shutdown_grace_seconds,
        on_stopped=[release],
    )
