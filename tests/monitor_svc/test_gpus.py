"""ListGpus and WatchGpus: NVML readings through gRPC, and a clear empty answer on hosts without a driver.

NVML itself cannot run here (no NVIDIA driver): the pynvml module is replaced at
its import point by a fake that returns NVML-shaped values and raises NVML's own
error types.
"""

from __future__ import annotations

import sys
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from monitor_svc.service import build_host
from quarry.clients.channels import insecure_channel
from quarry.config import MonitorSettings, QuarrySettings
from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.rpc import expect_error, violations


def fake_nvml(*, init_error: str | None = None) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    devices = [
        {"uuid": "GPU-aaaa", "name": b"NVIDIA H200", "power": 312_500, "processes": [(4242, 2**30)]},
        {"uuid": "GPU-bbbb", "name": "NVIDIA H200", "power": None, "processes": []},
    ]
    calls = {"init": 0, "shutdown": 0}

    def init() -> None:
        calls["init"] += 1
        if init_error:
            raise NVMLError_LibraryNotFound(init_error)

    def power(handle: int) -> int:
        value = devices[handle]["power"]
        if value is None:
            raise NVMLError_NotSupported("Not Supported")
        return int(value)

    members: dict[str, Any] = {
        "NVMLError": NVMLError,
        "NVMLError_NotSupported": NVMLError_NotSupported,
        "NVMLError_LibraryNotFound": NVMLError_LibraryNotFound,
        "NVML_TEMPERATURE_GPU": 0,
        "calls": calls,
        "nvmlInit": init,
        "nvmlShutdown": lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        "nvmlDeviceGetCount": lambda: len(devices),
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetUUID": lambda handle: devices[handle]["uuid"],
        "nvmlDeviceGetName": lambda handle: devices[handle]["name"],
        "nvmlDeviceGetMemoryInfo": lambda handle: types.SimpleNamespace(total=141 * 2**30, used=(handle + 1) * 2**30),
        "nvmlDeviceGetUtilizationRates": lambda handle: types.SimpleNamespace(gpu=87, memory=40),
        "nvmlDeviceGetTemperature": lambda handle, sensor: 61,
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetComputeRunningProcesses": lambda handle: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in devices[handle]["processes"]
        ],
    }
    for name, value in members.items():
        setattr(nvml, name, value)
    return nvml


@asynccontextmanager
async def serving(tmp_path: Any) -> AsyncIterator[monitor_pb2_grpc.MonitorServiceStub]:
    host = await build_host(
        MonitorSettings(address="127.0.0.1:0", allow_job_submission=True), QuarrySettings(data_dir=tmp_path)
    )
    async with host, insecure_channel(host.address) as channel:
        yield monitor_pb2_grpc.MonitorServiceStub(channel)


@pytest.fixture
async def monitor(tmp_path: Any) -> AsyncIterator[monitor_pb2_grpc.MonitorServiceStub]:
    async with serving(tmp_path) as stub:
        yield stub


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


async def test_gpus_are_listed_with_their_readings(nvml: types.ModuleType, tmp_path: Any) -> None:
    async with serving(tmp_path) as stub:
        response = await stub.ListGpus(monitor_pb2.ListGpusRequest())
    assert response.unavailable_reason == "" and response.HasField("sample_time")
    first, second = response.gpus
    assert (first.uuid, first.name, first.memory_total_bytes, first.memory_used_bytes) == (
        "GPU-aaaa",
        "NVIDIA H200",
        141 * 2**30,
        2**30,
    )
    assert (first.utilization_percent, first.temperature_celsius, first.power_watts) == (87, 61, 312.5)
    assert [(p.pid, p.used_memory_bytes) for p in first.processes] == [(4242, 2**30)]
    assert second.power_watts == 0 and second.name == "NVIDIA H200"  # not supported: left at zero
    assert nvml.calls == {"init": 1, "shutdown": 1}  # initialised once, shut down on stop


async def test_a_host_without_the_driver_answers_an_empty_list_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error="NVML Shared Library Not Found"))
    async with serving(tmp_path) as stub:
        response = await stub.ListGpus(monitor_pb2.ListGpusRequest())
        ticks = stub.WatchGpus(monitor_pb2.WatchGpusRequest(interval={"seconds": 1}))
        tick = await ticks.read()
        ticks.cancel()
    assert list(response.gpus) == [] and "NVML Shared Library Not Found" in response.unavailable_reason
    assert list(tick.gpus) == [] and tick.unavailable_reason == response.unavailable_reason


async def test_watch_gpus_ticks_and_refuses_bad_requests(
    nvml: types.ModuleType, monitor: monitor_pb2_grpc.MonitorServiceStub
) -> None:
    stream = monitor.WatchGpus(monitor_pb2.WatchGpusRequest(interval={"seconds": 1}))
    ticks = [await stream.read() for _ in range(2)]
    stream.cancel()
    assert all(len(tick.gpus) == 2 for tick in ticks)
    assert ticks[0].sample_time.ToNanoseconds() < ticks[1].sample_time.ToNanoseconds()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await monitor.WatchGpus(monitor_pb2.WatchGpusRequest(interval={"nanos": 500_000_000})).read()
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await expect_error(monitor.ListGpus(monitor_pb2.ListGpusRequest(host="gpu-7")), grpc.StatusCode.NOT_FOUND)
    error = await expect_error(monitor.SubmitJob(monitor_pb2.SubmitJobRequest()), grpc.StatusCode.INVALID_ARGUMENT)
    assert "job" in violations(error)
