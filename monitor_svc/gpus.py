"""Local GPUs through NVML (nvidia-ml-py): sampled in a thread, never an error when there is no driver.

NVML is initialised once per process and shut down on stop. A host without
the NVIDIA driver (or without nvidia-ml-py) reports no GPUs and the reason; a
field the driver does not support on a device is left at zero.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from quarry.vocabulary import Gpu, GpuProcess

log = logging.getLogger(__name__)


def _load_nvml() -> ModuleType:
    import pynvml  # imported here so a test can substitute the module

    module: ModuleType = pynvml
    return module


class NvmlProbe:
    def __init__(self, load: Callable[[], ModuleType] = _load_nvml) -> None:
        self.unavailable_reason = ""
        self._nvml: Any = None
        try:
            nvml = load()
        except ImportError:
            self.unavailable_reason = "nvidia-ml-py is not installed"
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            self.unavailable_reason = f"NVML is unavailable on this host: {error}"
            return
        self._nvml = nvml

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as error:
                log.warning("NVML shutdown failed: %s", error)
            self._nvml = None

    async def sample(self) -> tuple[list[Gpu], str]:
        """(the GPUs, why there are none): a driver error is a reason, not a failure."""
        if self._nvml is None:
            return [], self.unavailable_reason
        try:
            return await asyncio.to_thread(self._sample), ""
        except self._nvml.NVMLError as error:
            return [], f"NVML failed: {error}"

    def _sample(self) -> list[Gpu]:
        return [self._device(index) for index in range(self._nvml.nvmlDeviceGetCount())]

    def _optional(self, read: Callable[..., Any], *args: Any) -> Any:
        """A reading the device may not support: None instead of an error."""
        try:
            return read(*args)
        except self._nvml.NVMLError_NotSupported:
            return None

    def _device(self, index: int) -> Gpu:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = self._optional(nvml.nvmlDeviceGetMemoryInfo, handle)
        utilization = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        temperature = self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        power_milliwatts = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        processes = self._optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        return Gpu(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_bytes=int(memory.total) if memory else 0,
            memory_used_bytes=int(memory.used) if memory else 0,
            utilization_percent=int(utilization.gpu) if utilization else 0,
            temperature_celsius=int(temperature or 0),
            power_watts=(power_milliwatts or 0) / 1000.0,
            processes=tuple(GpuProcess(int(p.pid), int(p.usedGpuMemory or 0)) for p in processes),
        )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
