"""GPUs: this machine's through NVML (nvidia-ml-py), an SSH host's through nvidia-smi; and picking free ones.

NVML is initialised once per process and shut down on stop, and sampled in a
thread. A host without the NVIDIA driver (or without nvidia-ml-py) reports no
GPUs and the reason, never an error; a field the driver does not support on a
device is left at zero.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from monitor_svc.smi import APP_QUERY, GPU_QUERY, MalformedOutput, parse_gpus
from monitor_svc.ssh import SshHosts
from quarry.errors import ErrorReason, FailedPrecondition, ResourceExhausted
from quarry.vocabulary import Gpu, GpuProcess

LOCAL = "local"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuRequest:
    """A number of GPUs the monitor picks, or these indices."""

    count: int = 0
    indices: tuple[int, ...] = ()

    @property
    def wanted(self) -> bool:
        return bool(self.count or self.indices)


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


class GpuSampler:
    """The GPUs of this machine ("" or "local") or of a configured SSH host, each named with its host."""

    def __init__(self, probe: NvmlProbe, hosts: SshHosts) -> None:
        self._probe = probe
        self._hosts = hosts

    async def sample(self, host: str) -> tuple[list[Gpu], str]:
        """(the GPUs, the reason there are none)."""
        if host in ("", LOCAL):
            samples, reason = await self._probe.sample()
            return [replace(sample, host=LOCAL) for sample in samples], reason
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
        return [replace(sample, host=host) for sample in samples], ""


def choose_gpus(
    gpus: Sequence[Gpu], unavailable_reason: str, reserved: Collection[int], request: GpuRequest, where: str
) -> tuple[int, ...]:
    """The GPU indices for a job, ascending: the ones asked for, or the least-used free ones.

    FAILED_PRECONDITION GPUS_UNAVAILABLE when the host does not have them (retrying will not help);
    RESOURCE_EXHAUSTED GPUS_BUSY when it does but running jobs hold too many of them.
    """
    known = {gpu.index for gpu in gpus}
    have = f"{where} has {len(known)} GPU(s)" + (f" ({unavailable_reason})" if unavailable_reason else "")
    missing = sorted(set(request.indices) - known)
    if missing or request.count > len(known):
        wanted = f"GPU(s) {missing}" if missing else f"{request.count} GPU(s)"
        raise FailedPrecondition(f"{have}; {wanted} were asked for", reason=ErrorReason.GPUS_UNAVAILABLE)
    busy = sorted(set(request.indices) & set(reserved))
    if busy:
        raise ResourceExhausted(f"GPU(s) {busy} of {where} are reserved by running jobs", reason=ErrorReason.GPUS_BUSY)
    if request.indices:
        return tuple(sorted(request.indices))
    free = sorted((gpu for gpu in gpus if gpu.index not in reserved), key=lambda g: (g.memory_used_bytes, g.index))
    if len(free) < request.count:
        raise ResourceExhausted(
            f"{len(free)} of the {len(known)} GPU(s) of {where} are free (the others are reserved by running jobs); "
            f"{request.count} were asked for",
            reason=ErrorReason.GPUS_BUSY,
        )
    return tuple(sorted(gpu.index for gpu in free[: request.count]))
