"""Durable records of the jobs a monitor started: one JSON file per job, replaced atomically at each change.

A monitor that restarts reads them back, so SubmitJob with a request_id it
knows returns the job it started instead of starting a second, and the jobs
still running are followed again. A record is written before its job starts
(a monitor that stops in between finds a record without a process, and never
starts it again) and again once it runs and once it ends. It holds the names of
the job's environment variables, never their values (they may be secrets): the
request's digest covers those.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from monitor_svc.jobs.spec import JobKind
from monitor_svc.metrics import MetricResult, MetricSpec
from quarry.vocabulary import JobRef, JobState, MetricDirection

log = logging.getLogger(__name__)


def new_job_id() -> str:
    return f"job-{uuid.uuid4().hex[:16]}"


@dataclass
class JobRecord:
    monitor_job_id: str
    request_id: str
    digest: str  # of the submission: a request_id reused for another job is refused
    kind: JobKind  # stored as its value: "local", "remote" or "slurm"
    host: str = ""
    argv: list[str] = field(default_factory=list)
    working_directory: str = ""
    environment_names: list[str] = field(default_factory=list)
    log_path: str = ""
    pid: int = 0
    pgid: int = 0
    start_ticks: int | None = None  # the process's start time (/proc): tells it from a later process with its pid
    # A local job's log relay (log_relay.py): a restarted monitor waits for it to write the job's last output.
    relay_pid: int = 0
    relay_start_ticks: int | None = None
    slurm_job_id: str = ""
    gpus: list[int] = field(default_factory=list)
    wall_clock_limit: float | None = None  # seconds
    started_at: float | None = None  # epoch seconds: a deadline survives a restart of the monitor
    metrics: list[MetricSpec] = field(default_factory=list)
    workspace_id: str = ""  # the workspace it runs in, if any
    state: JobState = JobState.PENDING
    exit_code: int | None = None
    detail: str = ""
    results: list[MetricResult] = field(default_factory=list)
    ended_at: float | None = None

    @property
    def ref(self) -> JobRef:
        """The job as WatchJob names it; by its id alone while it has no process or Slurm job (yet)."""
        return JobRef(
            self.kind if self.pid or self.slurm_job_id else "",
            pid=self.pid,
            host=self.host,
            job_id=self.slurm_job_id,
            log_path=self.log_path,
            monitor_job_id=self.monitor_job_id,
        )

    @property
    def deadline(self) -> float | None:
        if self.wall_clock_limit is None or self.started_at is None:
            return None
        return self.started_at + self.wall_clock_limit


def to_json(record: JobRecord) -> str:
    return json.dumps(asdict(record), indent=1)


def from_json(text: str) -> JobRecord:
    """A record as written by to_json; ValueError, TypeError or KeyError for anything else."""
    data: dict[str, Any] = json.loads(text)
    known = {f.name for f in fields(JobRecord)}
    if not isinstance(data, dict) or not known >= data.keys():
        raise ValueError("not a job record")
    data["metrics"] = [
        MetricSpec(**{**spec, "direction": MetricDirection(spec["direction"]) if spec["direction"] else None})
        for spec in data.get("metrics", [])
    ]
    data["results"] = [
        MetricResult(**{**result, "direction": MetricDirection(result["direction"])})
        for result in data.get("results", [])
    ]
    data["state"] = JobState(data.get("state", JobState.PENDING))
    data["kind"] = JobKind(data["kind"])
    return JobRecord(**data)


class JobRecords:
    """The record files in one directory (created on first write, readable by the monitor's user only)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    async def save(self, record: JobRecord) -> None:
        await asyncio.to_thread(self._write, record)

    async def delete(self, record: JobRecord) -> None:
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(os.unlink, self._path(record.monitor_job_id))

    async def load(self) -> list[JobRecord]:
        return await asyncio.to_thread(self._read_all)

    def _path(self, monitor_job_id: str) -> Path:
        return self._directory / f"{monitor_job_id}.json"

    def _write(self, record: JobRecord) -> None:
        self._directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._path(record.monitor_job_id)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with open(descriptor, "w", encoding="utf-8") as handle:
                handle.write(to_json(record))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        directory = os.open(self._directory, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a crash
        finally:
            os.close(directory)

    def _read_all(self) -> list[JobRecord]:
        records: list[JobRecord] = []
        if not self._directory.is_dir():
            return records
        for path in sorted(self._directory.glob("job-*.json")):
            try:
                records.append(from_json(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError, KeyError) as error:
                log.warning("skipping the unreadable job record %s: %s", path, error)
        return records
