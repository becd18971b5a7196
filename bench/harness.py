"""What the benchmarks share: starting services as processes, and reading figures."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quarry.cli.launcher import serve_command


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


@contextmanager
def research_mesh(
    workdir: Path, model_url: str, fetch_allow: str, extra_env: dict[str, str] | None = None
) -> Iterator[str]:
    """Scratchpad, two workers and the supervisor as processes (SQLite); yields the supervisor's address."""
    env = {
        "QUARRY_DATA_DIR": str(workdir),
        "QUARRY_LOG_LEVEL": "WARNING",
        "QUARRY_MODEL_BASE_URL": model_url,
        "QUARRY_MODEL_NAME": "scripted",
        **(extra_env or {}),
    }
    processes = []
    try:
        scratchpad, scratchpad_address = start_service("scratchpad", env, workdir)
        processes.append(scratchpad)
        workers = []
        for n in range(2):
            (workdir / f"w{n}").mkdir(exist_ok=True)
            worker, address = start_service(
                "worker",
                {
                    **env,
                    "QUARRY_WORKER_DATABASE_URL": f"sqlite:///{workdir / f'worker{n}.db'}",
                    "QUARRY_WORKER_SCRATCHPAD_ADDRESS": scratchpad_address,
                    "QUARRY_WORKER_FETCH_ALLOW": fetch_allow,
                },
                workdir / f"w{n}",
            )
            processes.append(worker)
            workers.append(address)
        supervisor, supervisor_address = start_service(
            "supervisor",
            {
                **env,
                "QUARRY_SUPERVISOR_SCRATCHPAD_ADDRESS": scratchpad_address,
                "QUARRY_SUPERVISOR_WORKER_ADDRESSES": ",".join(workers),
            },
            workdir,
        )
        processes.append(supervisor)
        yield supervisor_address
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(30)
