"""Prints what ListGpus and one WatchGpus tick return on this machine, through a real monitor process.

    python3 bench/gpu_probe.py [--interval 1.0]

Meant for a machine with an NVIDIA driver (it reads NVML through nvidia-ml-py);
on one without, it prints the empty answer and the reason the monitor gives.
Also prints how long each call took. Figures only.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from harness import arguments, running_service

from quarry.clients.channels import insecure_channel
from quarry.v1 import monitor_pb2, monitor_pb2_grpc


def describe(gpus: list[monitor_pb2.Gpu], reason: str) -> str:
    if not gpus:
        return f"  no GPUs: {reason or 'none reported'}"
    lines = []
    for gpu in gpus:
        lines.append(
            f"  #{gpu.index} {gpu.name} {gpu.uuid}: {gpu.utilization_percent}% busy, "
            f"{gpu.memory_used_bytes / 2**30:.1f}/{gpu.memory_total_bytes / 2**30:.1f} GiB, "
            f"{gpu.temperature_celsius} C, {gpu.power_watts:.1f} W"
        )
        lines.extend(f"    pid {p.pid} {p.name}: {p.used_memory_bytes / 2**30:.2f} GiB" for p in gpu.processes)
    return "\n".join(lines)


async def main_async(interval: float) -> None:
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_service("monitor", {"QUARRY_DATA_DIR": workdir}, Path(workdir)) as (_, address),
    ):
        async with insecure_channel(address) as channel:
            stub = monitor_pb2_grpc.MonitorServiceStub(channel)
            started = time.perf_counter()
            listed = await stub.ListGpus(monitor_pb2.ListGpusRequest(), timeout=30)
            print(f"ListGpus ({(time.perf_counter() - started) * 1000:.1f} ms):")
            print(describe(list(listed.gpus), listed.unavailable_reason))
            request = monitor_pb2.WatchGpusRequest(
                interval={"nanos": int(interval * 1e9) % 10**9, "seconds": int(interval)}
            )
            started = time.perf_counter()
            async for tick in stub.WatchGpus(request, timeout=30):
                print(f"WatchGpus first tick ({(time.perf_counter() - started) * 1000:.1f} ms):")
                print(describe(list(tick.gpus), tick.unavailable_reason))
                break


def main() -> None:
    asyncio.run(main_async(arguments(__doc__, interval=1.0).interval))


if __name__ == "__main__":
    main()
