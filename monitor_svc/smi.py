"""GPUs of a remote host from `nvidia-smi` CSV output, parsed strictly: anything unexpected is an error that
shows the line, never a silently wrong reading."""

from __future__ import annotations

from collections.abc import Sequence

from quarry.vocabulary import Gpu, GpuProcess

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
)
APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")
GPU_QUERY = f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits"
APP_QUERY = f"nvidia-smi --query-compute-apps={','.join(APP_FIELDS)} --format=csv,noheader,nounits"
_MIB = 1024 * 1024
# What nvidia-smi prints for a reading the device does not give.
_MISSING = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""}


class MalformedOutput(ValueError):
    """nvidia-smi (or another tool) printed something that is not what its format promises."""


def _number(text: str, field: str, line: str) -> float:
    value = text.strip()
    if value in _MISSING:
        return 0.0
    try:
        return float(value)
    except ValueError:
        raise MalformedOutput(f"{field} is {value!r}, not a number, in line {line!r}") from None


def _rows(output: str, fields: Sequence[str]) -> list[tuple[list[str], str]]:
    rows = []
    for line in output.splitlines():
        if not line.strip():
            continue
        # The last field may itself hold commas (a process name): split only as often as there are fields.
        cells = [cell.strip() for cell in line.split(",", len(fields) - 1)]
        if len(cells) != len(fields):
            raise MalformedOutput(f"expected {len(fields)} comma-separated fields ({', '.join(fields)}), got {line!r}")
        rows.append((cells, line))
    return rows


def parse_gpus(gpu_output: str, app_output: str = "") -> list[Gpu]:
    """`GPU_QUERY`'s output (and `APP_QUERY`'s, for per-process memory) as samples."""
    processes: dict[str, list[GpuProcess]] = {}
    for (uuid, pid, used, name), line in _rows(app_output, APP_FIELDS):
        if not pid.isdigit():
            raise MalformedOutput(f"pid is {pid!r}, not a number, in line {line!r}")
        memory = int(_number(used, "used_memory", line) * _MIB)
        processes.setdefault(uuid, []).append(GpuProcess(int(pid), memory, name))
    gpus = []
    for (index, uuid, name, used, total, utilization, temperature, power), line in _rows(gpu_output, GPU_FIELDS):
        if not index.isdigit():
            raise MalformedOutput(f"index is {index!r}, not a number, in line {line!r}")
        gpus.append(
            Gpu(
                index=int(index),
                uuid=uuid,
                name=name,
                memory_used_bytes=int(_number(used, "memory.used", line) * _MIB),
                memory_total_bytes=int(_number(total, "memory.total", line) * _MIB),
                utilization_percent=int(_number(utilization, "utilization.gpu", line)),
                temperature_celsius=int(_number(temperature, "temperature.gpu", line)),
                power_watts=_number(power, "power.draw", line),
                processes=tuple(processes.get(uuid, ())),
            )
        )
    return gpus
