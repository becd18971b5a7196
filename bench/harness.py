"""What the benchmarks share: starting services as processes, and reading figures."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from quarry.launcher import serve_command


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_service(name: str, env: dict[str, str], workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`quarry serve NAME` on a free port; returns the process and its address once bound."""
    port_file = workdir / f"{name}.addr"
    process = subprocess.Popen(serve_command(name, port_file, address="127.0.0.1:0"), env={**os.environ, **env})
    for _ in range(600):
        if port_file.exists():
            return process, port_file.read_text().strip()
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{name} did not start")
