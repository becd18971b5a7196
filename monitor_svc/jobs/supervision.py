"""The supervision of every job the monitor started, whatever runs it, written once over JobExecutor.

A job's supervising task follows it until it ends: its state through its executor, its log metrics
as the log grows, its wall-clock limit where the monitor enforces it (SIGTERM to its process group,
SIGKILL after a grace: TIMED_OUT), its file metrics once it has ended; then its end, recorded.
Nothing a job writes ends its supervision: a fault reading its metrics is that metric's problem,
and any other fault of the monitor's ends the job's record with the reason, never leaves it running.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from monitor_svc.jobs.executor import JobExecutor, ProcessGroups
from monitor_svc.jobs.records import JobRecord, JobRecords
from monitor_svc.jobs.spec import JobKind, JobObservation
from monitor_svc.logs import LogCursor, Logs, split_lines
from monitor_svc.metrics import MetricTracker, jsonl_values, scan_lines
from quarry.errors import QuarryError, Unavailable
from quarry.vocabulary import JobState

log = logging.getLogger(__name__)

_CHUNKS_PER_POLL = 64  # a supervisor catching up with a long log reads at most this many chunks a poll
_FINAL_CHUNKS = 4096  # and once the job has ended, this many (1 GiB): a process it left may write on
_KILL_WAIT_SECONDS = 5.0  # after SIGKILL, how long the group is given to vanish


@dataclass(frozen=True)
class Supervision:
    """How the monitor follows the jobs it started."""

    poll_seconds: float = 2.0
    stop_grace_seconds: float = 10.0


@dataclass(eq=False)
class Job:
    """A job the monitor started: its record, what its supervisor last saw, and its metrics so far."""

    record: JobRecord
    tracker: MetricTracker
    observation: JobObservation
    supervisor: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def update(self, observation: JobObservation) -> None:
        self.observation = observation
        self.notify()

    def notify(self) -> None:
        """Wake the watches: the state changed, or new metric values came."""
        self.changed.set()
        self.changed = asyncio.Event()


class Supervisor:
    def __init__(
        self, executors: Mapping[JobKind, JobExecutor], logs: Logs, records: JobRecords, settings: Supervision
    ) -> None:
        self._executors = executors
        self._logs = logs
        self._records = records
        self._settings = settings

    def supervise(self, job: Job) -> None:
        job.supervisor = asyncio.create_task(self._follow(job), name=f"supervise {job.record.monitor_job_id}")
        job.supervisor.add_done_callback(_report_escape)

    async def save(self, record: JobRecord) -> None:
        """Write the record; a job that runs is not undone by a full disk (its state is kept in memory)."""
        try:
            await self._records.save(record)
        except OSError as error:
            log.error("cannot write the record of job %s: %s", record.monitor_job_id, error)
        except Exception:  # a record that cannot be written does not stop the job's end being seen
            log.exception("cannot write the record of job %s", record.monitor_job_id)

    async def end(self, job: Job, observation: JobObservation) -> None:
        record = job.record
        record.state, record.exit_code, record.detail = observation.state, observation.exit_code, observation.detail
        record.results, record.ended_at = list(observation.metrics), time.time()
        await self.save(record)
        job.update(observation)

    async def _follow(self, job: Job) -> None:
        """Until the job ends: its state, its wall-clock limit, its log metrics; then its end, recorded."""
        record = job.record
        cursor = LogCursor(record.log_path, record.host)
        executor = self._executors[record.kind]
        follow = executor.attach(record)
        groups = executor.groups
        deadline = record.deadline if groups is not None else None  # a scheduler stops its own jobs
        try:
            observation = job.observation
            while True:
                observation = await follow.poll(observation)
                await self._read_log_metrics(job, cursor, final=observation.state.ended)
                if observation.state.ended:
                    break
                if groups is not None and deadline is not None and time.time() >= deadline:
                    observation = await self._stop(record, groups)
                    await self._read_log_metrics(job, cursor, final=True)
                    break
                if (observation.state, observation.detail) != (job.observation.state, job.observation.detail):
                    job.update(observation)
                pause = self._settings.poll_seconds
                if deadline is not None:
                    pause = max(0.0, min(pause, deadline - time.time()))
                await follow.pause(pause)
            await self._read_file_metrics(job, executor)
            await self.end(job, replace(observation, metrics=job.tracker.results()))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a fault of the monitor's: the job is given up, not left "running" forever
            log.exception("supervising job %s failed", record.monitor_job_id)
            reason = f"the monitor stopped following it: {type(error).__name__}: {str(error)[:500]}"
            await self.end(job, JobObservation(JobState.UNKNOWN, detail=reason))

    async def _stop(self, record: JobRecord, groups: ProcessGroups) -> JobObservation:
        """Past its wall-clock limit: SIGTERM to its process group, SIGKILL to what is left after the grace."""
        grace = self._settings.stop_grace_seconds
        await groups.signal(record, signal.SIGTERM)
        killed = not await self._group_ends(record, groups, grace)
        if killed:
            await groups.signal(record, signal.SIGKILL)
            if not await self._group_ends(record, groups, _KILL_WAIT_SECONDS):
                log.warning("job %s: processes of group %d outlived SIGKILL", record.monitor_job_id, record.pgid)
        detail = f"stopped at its wall-clock limit of {record.wall_clock_limit:g} s: SIGTERM to its process group"
        if killed:
            detail += f", SIGKILL after a {grace:g} s grace"
        return JobObservation(JobState.TIMED_OUT, detail=detail)

    @staticmethod
    async def _group_ends(record: JobRecord, groups: ProcessGroups, seconds: float) -> bool:
        """Whether no process of the job's group is left within `seconds`."""
        give_up = time.monotonic() + seconds
        while await groups.alive(record):
            if time.monotonic() >= give_up:
                return False
            await asyncio.sleep(groups.poll_seconds)
        return True

    async def _read_log_metrics(self, job: Job, cursor: LogCursor, *, final: bool) -> None:
        """The log's new lines through the job's log patterns (all of it once the job has ended); a fault
        reading them is the log metrics' problem, not the end of the job's supervision."""
        tracker = job.tracker
        if not tracker.reads_log or tracker.problem:
            return
        try:
            await self._scan_log(job, cursor, final=final)
        except Exception as error:
            log.warning("job %s: its log metrics are no longer read", job.record.monitor_job_id, exc_info=True)
            tracker.problem = f"the log could not be read: {type(error).__name__}: {str(error)[:500]}"

    async def _scan_log(self, job: Job, cursor: LogCursor, *, final: bool) -> None:
        tracker = job.tracker
        reads = 0
        while reads < (_FINAL_CHUNKS if final else _CHUNKS_PER_POLL):
            reads += 1
            try:
                data, size = await self._logs.read(cursor, 0)
            except Unavailable as error:  # the host is unreachable for now; at the end, what was read counts
                if final:
                    tracker.problem = f"the end of the log could not be read: {error}"
                return
            except QuarryError as error:
                tracker.problem = f"the log could not be read: {error}"
                return
            lines = split_lines(cursor, data, final=final and cursor.offset >= size)
            if lines:
                scan = await asyncio.to_thread(scan_lines, tracker.metrics, lines, tracker.lines_read + 1)
                tracker.add_lines(scan, len(lines))
                if scan.points:
                    job.notify()
            if not data or cursor.offset >= size:
                return

    @staticmethod
    async def _read_file_metrics(job: Job, executor: JobExecutor) -> None:
        record = job.record
        for metric in job.tracker.metrics:
            spec = metric.spec
            if not spec.jsonl_path:
                continue
            try:
                data = await executor.read_file(record, spec.jsonl_path)
            except QuarryError as error:
                job.tracker.add_file(spec, [], f"{spec.jsonl_path} could not be read: {error}")
                continue
            if data is None:
                job.tracker.add_file(spec, [], f"{spec.jsonl_path} does not exist in {record.working_directory}")
                continue
            try:
                values = await asyncio.to_thread(jsonl_values, spec, data.split(b"\n"))
            except Exception as error:  # jsonl_values skips any line; this is a fault of the monitor's
                log.warning("job %s: %s could not be read", record.monitor_job_id, spec.jsonl_path, exc_info=True)
                job.tracker.add_file(spec, [], f"{spec.jsonl_path} could not be read: {type(error).__name__}")
                continue
            job.tracker.add_file(spec, values)


def _report_escape(task: asyncio.Task[None]) -> None:
    """A supervision that ended by a fault even its own handler could not record is logged, never silent."""
    if not task.cancelled() and task.exception() is not None:
        log.error("%s ended by a fault", task.get_name(), exc_info=task.exception())
