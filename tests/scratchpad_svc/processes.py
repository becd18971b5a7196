"""Scratchpad service processes and writer processes for the multi-process tests, each stopped at teardown."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from quarry.clients.scratchpad import ScratchpadClient
from quarry.v1 import scratchpad_pb2
from tests.conftest import ServiceProcess, kill_all, start_service, stop_service

ROOT = Path(__file__).resolve().parents[2]


def service_env(database_url: str, data_dir: Path) -> dict[str, str]:
    return {
        "QUARRY_SCRATCHPAD_DATABASE_URL": database_url,
        "QUARRY_DATA_DIR": str(data_dir),
        "QUARRY_LOG_LEVEL": "WARNING",
    }


class Processes:
    """Every process a test starts; whatever is still running at teardown is stopped or killed."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.services: list[ServiceProcess] = []
        self.writers: list[subprocess.Popen[str]] = []

    async def service(self, env: dict[str, str], *, port: int = 0) -> ServiceProcess:
        service = await asyncio.to_thread(start_service, "scratchpad", env, self.workdir, port=port)
        self.services.append(service)
        return service

    def start_writers(
        self, address: str, thread_id: str, writers: int, count: int, first_writer: int = 0
    ) -> list[subprocess.Popen[str]]:
        started = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.scratchpad_svc.writer", address, thread_id, str(writer), str(count)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for writer in range(first_writer, first_writer + writers)
        ]
        self.writers.extend(started)
        return started

    def assert_services_stop_cleanly(self) -> None:
        for service in self.services:
            if service.process.poll() is None:
                assert stop_service(service) == 0, service.log()

    def close(self) -> None:
        kill_all(self.writers)
        for service in self.services:
            stop_service(service)


async def collect_writers(processes: list[subprocess.Popen[str]], wait_seconds: float) -> list[list[dict[str, object]]]:
    """Each writer's acknowledged appends, in the order it made them."""
    outputs = []
    for process in processes:
        stdout, stderr = await asyncio.to_thread(process.communicate, timeout=wait_seconds)
        assert process.returncode == 0, f"writer failed:\n{stderr[-3000:]}"
        outputs.append([json.loads(line) for line in stdout.splitlines()])
    return outputs


async def watch_until(
    client: ScratchpadClient, thread_id: str, count: int, opened: asyncio.Event
) -> list[scratchpad_pb2.Entry]:
    """Watch from 0 until `count` entries arrived; `opened` is set once the service accepted the stream."""
    received: list[scratchpad_pb2.Entry] = []
    async for entry in client.watch(thread_id, after_sequence_no=0, on_established=opened.set):
        received.append(entry)
        if len(received) == count:
            break
    return received


def assert_gap_free(entries: list[scratchpad_pb2.Entry], total: int) -> None:
    assert [entry.sequence_no for entry in entries] == list(range(1, total + 1))
    assert len({entry.request_id for entry in entries}) == total
