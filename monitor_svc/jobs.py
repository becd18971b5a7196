"""Jobs the monitor starts and watches: local processes, processes on SSH hosts, and Slurm jobs. No model is involved.

A local job the monitor started keeps its real exit status (its process is
our child): a crash is FAILED with its exit code, never "completed". A job it
started on an SSH host runs under a small wrapper that leaves its exit status
next to its log. Any other process can only be seen alive or gone, so its end
is EXITED. Slurm's sacct is the authority on a job's state, squeue the fallback
while sacct has no record; a job neither knows is given up as UNKNOWN after a
number of polls or once its time limit plus a buffer has passed.

Every job SubmitJob starts has a durable record (monitor_svc.records) and a
supervising task of the monitor's: it notices the job's end, stops a process
at its wall-clock limit (SIGTERM to its process group, SIGKILL after a grace:
TIMED_OUT; Slurm stops its own jobs at --time), reads its log metrics as the
log grows and its file metrics once it has ended, and records the end. A Slurm
job writes its output (--output) under its host's first log root, where it is
read as a remote job's log is. Watches of such a job report what the
supervisor saw. A monitor that restarts reloads the records
and supervises the jobs still running again, as processes it did not start (a
process's start time tells it from a later one with its pid).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import posixpath
import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from monitor_svc import processes, slurm
from monitor_svc.gpus import GpuSampler, choose_gpus
from monitor_svc.logs import LogCursor, Logs, open_log, split_lines
from monitor_svc.metrics import CompiledMetric, MetricTracker, compile_metrics, jsonl_values, scan_lines
from monitor_svc.model import Command, GpuRequest, JobObservation, JobOptions
from monitor_svc.records import JobRecord, JobRecords, new_job_id
from monitor_svc.smi import MalformedOutput
from monitor_svc.ssh import SshHosts, quote
from monitor_svc.validation import (
    check_environment,
    check_gpu_request,
    command_argv,
    refuse_nul,
    wall_clock_limit,
)
from monitor_svc.workspaces.model import LOCAL, WorkspaceRecord
from monitor_svc.workspaces.operations import Workspaces
from quarry.errors import (
    AlreadyExists,
    ErrorReason,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QuarryError,
    Unavailable,
)
from quarry.vocabulary import JobRef, JobState

log = logging.getLogger(__name__)

_T = TypeVar("_T")
MAX_REQUEST_ID_CHARS = 256
MAX_JSONL_BYTES = 64 * 1024 * 1024  # of a metrics file, its last part is read
_CHUNKS_PER_POLL = 64  # a supervisor catching up with a long log reads at most this many chunks a poll
_FINAL_CHUNKS = 4096  # and once the job has ended, this many (1 GiB): a process it left may write on
_KILL_WAIT_SECONDS = 5.0  # after SIGKILL, how long the group is given to vanish
# A job accounting says is still running, though the queue has forgotten it past its time limit, is given up.
_RUNAWAY = "sacct still says {state}, but squeue no longer lists the job, past its time limit; given up"


@dataclass(frozen=True)
class SlurmLimits:
    unknown_polls: int = 30
    time_limit_buffer_seconds: float = 600.0


@dataclass(frozen=True)
class Supervision:
    """How the monitor follows the jobs it started."""

    poll_seconds: float = 2.0
    stop_grace_seconds: float = 10.0


@dataclass
class _Watch:
    """What one WatchJob remembers between polls."""

    ref: JobRef
    cursor: LogCursor
    started: float = field(default_factory=time.monotonic)
    seen_alive: bool = False
    unknown_polls: int = 0
    time_limit: float | None = None

    @classmethod
    def of(cls, ref: JobRef) -> _Watch:
        return cls(ref, LogCursor(ref.log_path, "" if ref.kind == "local" else ref.host))


@dataclass(eq=False)
class _Job:
    """A job the monitor started: its record, what its supervisor last saw, and its metrics so far."""

    record: JobRecord
    tracker: MetricTracker
    observation: JobObservation
    process: asyncio.subprocess.Process | None = None  # while it is this monitor's child
    supervisor: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def update(self, observation: JobObservation) -> None:
        self.observation = observation
        self.notify()

    def notify(self) -> None:
        """Wake the watches: the state changed, or new metric values came."""
        self.changed.set()
        self.changed = asyncio.Event()


class Jobs:
    def __init__(
        self,
        hosts: SshHosts,
        gpus: GpuSampler,
        jobs_dir: Path,
        records: JobRecords,
        limits: SlurmLimits,
        log_roots: Sequence[str] = (),
        *,
        workspaces: Workspaces,
        allow_submission: bool = False,
        supervision: Supervision = Supervision(),
    ) -> None:
        self._hosts = hosts
        self._workspaces = workspaces
        self._gpus = gpus
        self._allow_submission = allow_submission
        self._jobs_dir = jobs_dir
        self._records = records
        self._limits = limits
        self._supervision = supervision
        self._logs = Logs(hosts, (str(jobs_dir), *log_roots))
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._jobs: dict[str, _Job] = {}  # by monitor_job_id
        self._by_request: dict[str, _Job] = {}
        self._submitting: dict[str, tuple[str, asyncio.Task[_Job]]] = {}  # request_id -> (digest, submission)
        self._reserving: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)  # per host: GPU choice

    # -- lifecycle -------------------------------------------------------------------------------

    async def resume(self) -> None:
        """Reload the records of the jobs this monitor started, and supervise those still running again."""
        for record in await self._records.load():
            try:
                metrics = compile_metrics(record.metrics, working_directory=record.working_directory)
            except InvalidArgument as error:
                log.warning("job %s: its metrics can no longer be read: %s", record.monitor_job_id, error)
                metrics = ()
            observation = JobObservation(record.state, record.exit_code, record.detail, metrics=tuple(record.results))
            job = self._register(_Job(record, MetricTracker(metrics), observation))
            if record.state.ended:
                continue
            if not record.pid and not record.slurm_job_id:
                await self._end(job, JobObservation(JobState.UNKNOWN, detail=_INTERRUPTED))
                continue
            self._supervise(job)

    async def close(self) -> None:
        """Stop supervising; the jobs run on, and a monitor that starts again takes them up."""
        tasks = [job.supervisor for job in self._jobs.values() if job.supervisor is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- submission -------------------------------------------------------------------------------

    def check_log_path(self, ref: JobRef, field_name: str = "job.log_path") -> None:
        """Refuse a log path outside the configured roots (the monitor's job directory, a host's log_roots)."""
        self._logs.check_path(ref.log_path, "" if ref.kind == "local" else ref.host, field_name)

    def _check_submission_allowed(self) -> None:
        # A job runs as the monitor's user; a deployment that wants that says so.
        if not self._allow_submission:
            raise PermissionDenied(
                "this monitor does not run jobs; set QUARRY_MONITOR_ALLOW_JOB_SUBMISSION=true to allow SubmitJob",
                reason=ErrorReason.JOB_SUBMISSION_DISABLED,
            )

    async def _in_workspace(self, command: Command, options: JobOptions, kind: str) -> Command:
        """The command placed in its workspace: on the workspace's host, in its root or a directory inside it."""
        record, directory = await self._workspaces.job_path(
            options.workspace_id, command.working_directory, f"{kind}.working_directory", directory=True
        )
        return replace(command, host=_workspace_host(record, command.host, kind), working_directory=directory)

    async def submit_local(self, command: Command, options: JobOptions, request_id: str) -> JobRecord:
        self._check_submission_allowed()
        argv = command_argv(command.argv, command.command_line, "local")
        refuse_nul(
            {
                "local.working_directory": command.working_directory,
                "local.log_path": command.log_path,
                "request_id": request_id,
                "options.workspace_id": options.workspace_id,
            }
        )
        # As the request says (a workspace's directory relative to its root): a retry is the same submission.
        payload = ["local", list(argv), command.working_directory, command.log_path, _options_payload(options)]
        if options.workspace_id:
            command = await self._in_workspace(command, options, "local")
        metrics = _checked_options(options, command.working_directory)
        self.check_log_path(JobRef("local", log_path=command.log_path), "local.log_path")
        return await self._once(
            request_id, payload, lambda digest: self._start_local(argv, command, options, metrics, request_id, digest)
        )

    async def submit_remote(self, command: Command, options: JobOptions, request_id: str) -> JobRecord:
        self._check_submission_allowed()
        argv = command_argv(command.argv, command.command_line, "remote")
        refuse_nul(
            {
                "remote.host": command.host,
                "remote.working_directory": command.working_directory,
                "remote.log_path": command.log_path,
                "request_id": request_id,
                "options.workspace_id": options.workspace_id,
            }
        )
        payload = [
            "remote",
            command.host,
            list(argv),
            command.working_directory,
            command.log_path,
            _options_payload(options),
        ]
        if options.workspace_id:
            command = await self._in_workspace(command, options, "remote")
        self._hosts.require(command.host, field="remote.host")
        if command.working_directory and not posixpath.isabs(command.working_directory):
            raise InvalidArgument([FieldViolation("remote.working_directory", "an absolute path")])
        metrics = _checked_options(options, command.working_directory)
        if not self._logs.host_roots(command.host):
            raise FailedPrecondition(
                f"{command.host} has no log_roots: its jobs' logs must go under one",
                reason=ErrorReason.LOG_PATH_NOT_ALLOWED,
            )
        self.check_log_path(JobRef("remote", host=command.host, log_path=command.log_path), "remote.log_path")
        return await self._once(
            request_id, payload, lambda digest: self._start_remote(argv, command, options, metrics, request_id, digest)
        )

    async def submit_slurm(
        self, host: str, script_path: str, sbatch_args: Sequence[str], options: JobOptions, request_id: str
    ) -> JobRecord:
        self._check_submission_allowed()
        refuse_nul(
            {
                "slurm.host": host,
                "slurm.script_path": script_path,
                **{f"slurm.sbatch_args[{index}]": arg for index, arg in enumerate(sbatch_args)},
                "request_id": request_id,
                "options.workspace_id": options.workspace_id,
            }
        )
        if not script_path or script_path.startswith("-"):
            # Not an option in disguise: sbatch would read "-..." as one.
            raise InvalidArgument([FieldViolation("slurm.script_path", "required: the batch script on the host")])
        payload = ["slurm", host, script_path, list(sbatch_args), _options_payload(options)]
        directory = ""
        if options.workspace_id:
            record, script_path = await self._workspaces.job_path(
                options.workspace_id, script_path, "slurm.script_path", directory=False
            )
            host, directory = _workspace_host(record, host, "slurm"), record.root
        self._hosts.require(host, field="slurm.host")
        if options.gpus.indices:
            raise InvalidArgument([FieldViolation("options.gpus.indices", "Slurm picks the GPUs: ask for a count")])
        # JSON-lines files are read in the workspace root, where the job starts; log patterns in its output.
        metrics = _checked_options(options, directory)
        if any(metric.pattern is not None for metric in metrics) and not self._logs.host_roots(host):
            raise FailedPrecondition(
                f"{host} has no log_roots: a Slurm job's output must go under one for its log metrics",
                reason=ErrorReason.LOG_PATH_NOT_ALLOWED,
            )
        # After the caller's arguments, so that these win; the environment goes through sbatch's own.
        args = [*sbatch_args]
        if options.gpus.count:
            args.append(f"--gres=gpu:{options.gpus.count}")
        if options.wall_clock_limit is not None:
            args.append(f"--time={slurm.format_time_limit(options.wall_clock_limit)}")
        if directory:
            args.append(f"--chdir={directory}")
        placed = Command(host=host, working_directory=directory)
        return await self._once(
            request_id,
            payload,
            lambda digest: self._start_slurm(placed, args, script_path, options, metrics, request_id, digest),
        )

    async def _once(self, request_id: str, payload: object, start: Callable[[str], Awaitable[_Job]]) -> JobRecord:
        """Idempotent by request_id, across restarts too: a repeat gets the job the first call started, even if
        that caller left; a request_id used for another job is refused."""
        if not request_id:
            raise InvalidArgument([FieldViolation("request_id", "required: a retry must not start a second job")])
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidArgument([FieldViolation("request_id", f"at most {MAX_REQUEST_ID_CHARS} characters")])
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        if request_id not in self._submitting and request_id not in self._by_request:
            # A task of its own: a caller that goes away (a deadline) does not undo a started submission.
            self._submitting[request_id] = (digest, asyncio.ensure_future(start(digest)))
        # Still starting (it is registered before it starts): its answer once it has started.
        expected, submission = self._submitting.get(request_id) or (self._by_request[request_id].record.digest, None)
        if expected != digest:
            raise AlreadyExists(
                f"request_id {request_id!r} already started a different job", reason=ErrorReason.REQUEST_ID_REUSED
            )
        if submission is None:
            return self._by_request[request_id].record
        try:
            return (await asyncio.shield(submission)).record
        finally:
            # Once done it is registered, or it failed and a retry may try again.
            if submission.done() and self._submitting.get(request_id, (None, None))[1] is submission:
                del self._submitting[request_id]

    def _register(self, job: _Job) -> _Job:
        self._jobs[job.record.monitor_job_id] = job
        self._by_request[job.record.request_id] = job
        return job

    def _forget(self, job: _Job) -> None:
        self._jobs.pop(job.record.monitor_job_id, None)
        self._by_request.pop(job.record.request_id, None)

    async def _reserve(self, host: str, request: GpuRequest) -> tuple[int, ...]:
        """GPUs for a new job on `host` ("" for this machine), none held by a running job of this monitor."""
        if not request.wanted:
            return ()
        gpus, reason = await self._gpus.sample(host)
        reserved = {
            index
            for job in self._jobs.values()
            if job.record.kind != "slurm" and job.record.host == host and not job.observation.state.ended
            for index in job.record.gpus
        }
        return choose_gpus(gpus, reason, reserved, request, host or "this machine")

    async def _start_local(
        self,
        argv: tuple[str, ...],
        command: Command,
        options: JobOptions,
        metrics: tuple[CompiledMetric, ...],
        request_id: str,
        digest: str,
    ) -> _Job:
        record = _new_record("local", request_id, digest, options, argv, command)
        log_file = Path(command.log_path) if command.log_path else self._jobs_dir / f"{record.monitor_job_id}.log"
        record.log_path = str(log_file)
        try:
            await asyncio.to_thread(log_file.parent.mkdir, parents=True, exist_ok=True)
        except OSError as error:
            raise FailedPrecondition(
                f"cannot write the log {log_file}: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
            ) from error
        # Created, or appended to if it is a regular file with one link: never a FIFO (which would block
        # until a reader came) nor a hard link to a file elsewhere.
        descriptor = await asyncio.to_thread(
            open_log, str(log_file), self._logs.local_roots, os.O_WRONLY | os.O_APPEND | os.O_CREAT
        )
        if descriptor is None:  # O_CREAT made it, unless its directory went away meanwhile
            raise FailedPrecondition(f"cannot write the log {log_file}", reason=ErrorReason.JOB_NOT_STARTED)
        try:
            async with self._reserving[""]:
                record.gpus = list(await self._reserve("", options.gpus))
                job = await self._pending(record, metrics)
                try:
                    process = await asyncio.create_subprocess_exec(
                        *argv,
                        cwd=command.working_directory or None,
                        env=_environment(options.environment, record.gpus),
                        stdout=descriptor,
                        stderr=asyncio.subprocess.STDOUT,
                        stdin=asyncio.subprocess.DEVNULL,
                        start_new_session=True,  # outlives the monitor; its group is the job's, to stop it whole
                    )
                except OSError as error:
                    await self._abandon(job)
                    raise FailedPrecondition(
                        f"cannot start {argv[0]!r}: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
                    ) from error
        finally:
            os.close(descriptor)  # the job has its own copy
        self._children[process.pid] = process
        job.process = process
        record.pid = record.pgid = process.pid
        record.start_ticks = processes.start_ticks(process.pid)
        await self._started(job, f"process {process.pid}")
        return job

    async def _start_remote(
        self,
        argv: tuple[str, ...],
        command: Command,
        options: JobOptions,
        metrics: tuple[CompiledMetric, ...],
        request_id: str,
        digest: str,
    ) -> _Job:
        host = command.host
        roots = self._logs.host_roots(host)
        record = _new_record("remote", request_id, digest, options, argv, command)
        record.log_path = command.log_path or posixpath.join(roots[0], f"{record.monitor_job_id}.log")
        await self._hosts.connect(host)  # unreachable: refused before anything is recorded
        async with self._reserving[host]:
            record.gpus = list(await self._reserve(host, options.gpus))
            job = await self._pending(record, metrics)
            launch = processes.remote_launch(
                argv,
                command.working_directory,
                {**options.environment, **_gpu_environment(record.gpus)},
                record.log_path,
                _status_path(record),
                roots,
            )
            try:
                result = await self._hosts.run(host, launch)
            except QuarryError as error:
                # It may have started: the job is given up, never started again for this request_id.
                await self._end(job, JobObservation(JobState.UNKNOWN, detail=f"{_INTERRUPTED}: {error}"))
                raise Unavailable(f"starting the job on {host} failed midway ({error}); it may have started") from error
        words = (result.stdout.strip().splitlines() or ["?"])[-1].split()
        if result.exit_status != 0 or not words or words[0] != "started" or not words[1:2] or not words[1].isdigit():
            await self._abandon(job)
            raise _not_launched(host, record, words, result.stderr)
        record.pid = record.pgid = int(words[1])
        record.start_ticks = int(words[2]) if len(words) > 2 and words[2].isdigit() else None
        await self._started(job, f"process {record.pid} on {host}")
        return job

    async def _start_slurm(
        self,
        placed: Command,
        args: Sequence[str],
        script_path: str,
        options: JobOptions,
        metrics: tuple[CompiledMetric, ...],
        request_id: str,
        digest: str,
    ) -> _Job:
        host = placed.host
        record = _new_record("slurm", request_id, digest, options, (), placed)
        roots = self._logs.host_roots(host)
        if roots:  # stdout and stderr, read as a remote job's log
            record.log_path = posixpath.join(roots[0], f"{record.monitor_job_id}.log")
            args = [*args, f"--output={record.log_path}"]
        prefix = ["env", *(f"{name}={value}" for name, value in options.environment.items())]
        command = quote(*(prefix if options.environment else []), "sbatch", "--parsable", *args, script_path)
        job = await self._pending(record, metrics)
        try:
            result = await self._hosts.run(host, command)
        except QuarryError as error:
            await self._end(job, JobObservation(JobState.UNKNOWN, detail=f"{_INTERRUPTED}: {error}"))
            raise Unavailable(f"sbatch on {host} failed midway ({error}); the job may have been submitted") from error
        if result.exit_status != 0:
            await self._abandon(job)
            raise FailedPrecondition(
                f"sbatch on {host} failed ({result.exit_status}): {result.stderr.strip() or result.stdout.strip()}",
                reason=ErrorReason.SBATCH_FAILED,
            )
        try:
            record.slurm_job_id = _parsed(host, slurm.parse_sbatch, result.stdout)
        except FailedPrecondition:
            await self._end(job, JobObservation(JobState.UNKNOWN, detail=f"sbatch printed {result.stdout!r}"))
            raise
        record.state, record.detail, record.started_at = JobState.PENDING, "submitted to Slurm", time.time()
        job.update(JobObservation(JobState.PENDING, detail=record.detail))
        await self._save(record)
        self._supervise(job)
        return job

    async def _pending(self, record: JobRecord, metrics: tuple[CompiledMetric, ...]) -> _Job:
        """Record the job before it starts (a monitor stopping meanwhile must not start it twice); it now holds
        its GPUs."""
        try:
            await self._records.save(record)
        except OSError as error:
            raise FailedPrecondition(
                f"cannot write the job's record: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
            ) from error
        return self._register(_Job(record, MetricTracker(metrics), JobObservation(JobState.PENDING, detail="starting")))

    async def _abandon(self, job: _Job) -> None:
        """It did not start: no record, and a retry may try again."""
        self._forget(job)
        try:
            await self._records.delete(job.record)
        except OSError as error:
            log.error("cannot remove the record of job %s: %s", job.record.monitor_job_id, error)

    async def _started(self, job: _Job, what: str) -> None:
        record = job.record
        record.state, record.detail, record.started_at = JobState.RUNNING, f"{what} started", time.time()
        job.update(JobObservation(JobState.RUNNING, detail=record.detail))
        await self._save(record)
        self._supervise(job)

    async def _save(self, record: JobRecord) -> None:
        """Write the record; a job that runs is not undone by a full disk (its state is kept in memory)."""
        try:
            await self._records.save(record)
        except OSError as error:
            log.error("cannot write the record of job %s: %s", record.monitor_job_id, error)

    async def _end(self, job: _Job, observation: JobObservation) -> None:
        record = job.record
        record.state, record.exit_code, record.detail = observation.state, observation.exit_code, observation.detail
        record.results, record.ended_at = list(observation.metrics), time.time()
        await self._save(record)
        job.update(observation)

    # -- supervision ---------------------------------------------------------------------------------

    def _supervise(self, job: _Job) -> None:
        job.supervisor = asyncio.create_task(self._follow(job), name=f"supervise {job.record.monitor_job_id}")

    async def _follow(self, job: _Job) -> None:
        """Until the job ends: its state, its wall-clock limit, its log metrics; then its end, recorded."""
        record = job.record
        cursor = LogCursor(record.log_path, record.host)
        sacct = _Watch.of(record.ref) if record.kind == "slurm" else None
        try:
            observation = job.observation
            while True:
                observation = await self._look(job, observation, sacct)
                await self._read_log_metrics(job, cursor, final=observation.state.ended)
                if observation.state.ended:
                    break
                deadline = record.deadline if sacct is None else None  # Slurm stops its jobs at --time
                if deadline is not None and time.time() >= deadline:
                    observation = await self._stop(job)
                    await self._read_log_metrics(job, cursor, final=True)
                    break
                if (observation.state, observation.detail) != (job.observation.state, job.observation.detail):
                    job.update(observation)
                await self._pause(job, deadline)
            await self._read_file_metrics(job)
            await self._end(job, replace(observation, metrics=job.tracker.results()))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a fault of the monitor's: the job is given up, not left "running" forever
            log.exception("supervising job %s failed", record.monitor_job_id)
            await self._end(job, JobObservation(JobState.UNKNOWN, detail=f"the monitor stopped following it: {error}"))

    async def _look(self, job: _Job, previous: JobObservation, sacct: _Watch | None) -> JobObservation:
        record = job.record
        if sacct is not None:
            try:
                return await self._observe_slurm(sacct)
            except Unavailable as error:  # the login host is unreachable for now: the job is as it was
                log.warning("job %s on %s: %s", record.monitor_job_id, record.host, error)
                return previous
        if record.kind == "local":
            if job.process is not None:
                return _exit_observation(job.process.returncode)  # asyncio's child watcher sets it at the end
            if await asyncio.to_thread(processes.is_running, record.pid, record.start_ticks):
                return JobObservation(JobState.RUNNING, detail=f"process {record.pid} is running")
            return JobObservation(JobState.EXITED, detail=f"process {record.pid} has ended; {_NOT_OURS}")
        try:
            result = await self._hosts.run(
                record.host, processes.remote_stat(record.pid) + processes.remote_status(_status_path(record))
            )
        except QuarryError as error:  # the host is unreachable for now: the job is as it was
            log.warning("job %s on %s: %s", record.monitor_job_id, record.host, error)
            return previous
        first, *rest = result.stdout.splitlines() or [""]
        running = processes.parse_remote_stat(first, record.start_ticks)
        status = "".join(rest).strip()
        if status.isdigit():
            return _exit_observation(int(status))
        if running is None:
            log.warning("job %s on %s: unexpected output %r", record.monitor_job_id, record.host, result.stdout[:200])
            return previous
        if running:
            return JobObservation(JobState.RUNNING, detail=f"process {record.pid} on {record.host} is running")
        return JobObservation(
            JobState.EXITED,
            detail=f"process {record.pid} on {record.host} has ended without an exit status (killed by a signal?)",
        )

    async def _pause(self, job: _Job, deadline: float | None) -> None:
        timeout = self._supervision.poll_seconds
        if deadline is not None:
            timeout = max(0.0, min(timeout, deadline - time.time()))
        if job.process is None:
            await asyncio.sleep(timeout)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(job.process.wait(), timeout)  # its end is seen at once

    async def _stop(self, job: _Job) -> JobObservation:
        """Past its wall-clock limit: SIGTERM to its process group, SIGKILL to what is left after the grace."""
        record = job.record
        grace = self._supervision.stop_grace_seconds
        await self._signal(record, signal.SIGTERM)
        killed = not await self._group_ends(record, grace)
        if killed:
            await self._signal(record, signal.SIGKILL)
            if not await self._group_ends(record, _KILL_WAIT_SECONDS):
                log.warning("job %s: processes of group %d outlived SIGKILL", record.monitor_job_id, record.pgid)
        detail = f"stopped at its wall-clock limit of {record.wall_clock_limit:g} s: SIGTERM to its process group"
        if killed:
            detail += f", SIGKILL after a {grace:g} s grace"
        return JobObservation(JobState.TIMED_OUT, detail=detail)

    async def _signal(self, record: JobRecord, number: signal.Signals) -> None:
        if record.kind == "local":
            processes.signal_group(record.pgid, number)
            return
        with contextlib.suppress(QuarryError):  # an unreachable host: the wait below says the group lives on
            await self._hosts.run(record.host, processes.remote_signal_group(record.pgid, number.name[3:]))

    async def _group_ends(self, record: JobRecord, seconds: float) -> bool:
        """Whether no process of the job's group is left within `seconds`."""
        give_up = time.monotonic() + seconds
        while True:
            if record.kind == "local":
                alive = await asyncio.to_thread(processes.group_alive, record.pgid)
            else:
                try:
                    result = await self._hosts.run(record.host, processes.remote_group_alive(record.pgid))
                    alive = result.stdout.strip() != "gone"
                except QuarryError:
                    alive = True
            if not alive:
                return True
            if time.monotonic() >= give_up:
                return False
            await asyncio.sleep(0.1 if record.kind == "local" else 0.5)

    async def _read_log_metrics(self, job: _Job, cursor: LogCursor, *, final: bool) -> None:
        """The log's new lines through the job's log patterns (all of it once the job has ended)."""
        tracker = job.tracker
        if not tracker.reads_log or tracker.problem:
            return
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

    async def _read_file_metrics(self, job: _Job) -> None:
        record = job.record
        for metric in job.tracker.metrics:
            spec = metric.spec
            if not spec.jsonl_path:
                continue
            try:
                if record.kind == "local":
                    data = await asyncio.to_thread(_read_local_file, record.working_directory, spec.jsonl_path)
                else:
                    data = await self._read_remote_file(record, spec.jsonl_path)
            except QuarryError as error:
                job.tracker.add_file(spec, [], f"{spec.jsonl_path} could not be read: {error}")
                continue
            if data is None:
                job.tracker.add_file(spec, [], f"{spec.jsonl_path} does not exist in {record.working_directory}")
                continue
            values = await asyncio.to_thread(jsonl_values, spec, data.split(b"\n"))
            job.tracker.add_file(spec, values)

    async def _read_remote_file(self, record: JobRecord, relative: str) -> bytes | None:
        """The file (its last MAX_JSONL_BYTES) under the job's working directory on its host; None if missing."""
        path = posixpath.join(record.working_directory, relative)
        roots = [record.working_directory]
        chunk = await self._logs.read_remote(record.host, path, roots, 0, tail=False)
        if not chunk.exists:
            return None
        start = max(chunk.size - MAX_JSONL_BYTES, 0)
        if start:
            chunk = await self._logs.read_remote(record.host, path, roots, start, tail=False)
        parts = [chunk.data]
        while chunk.data and chunk.start + len(chunk.data) < chunk.size:
            chunk = await self._logs.read_remote(record.host, path, roots, chunk.start + len(chunk.data), tail=False)
            parts.append(chunk.data)
        return _whole_lines(b"".join(parts), cut=start > 0)

    # -- watching ------------------------------------------------------------------------------------

    async def watch(self, ref: JobRef, interval: float, tail_lines: int) -> AsyncIterator[JobObservation]:
        """The job's state and the last log lines, then every change (state, new lines, metric values) until it
        ends. A job the monitor started (ref.monitor_job_id) is reported as its supervisor sees it."""
        if ref.monitor_job_id:
            async for observation in self._watch_job(self._job_for(ref), interval, tail_lines):
                yield observation
            return
        self.check_log_path(ref)
        watch = _Watch.of(ref)
        previous: tuple[JobState, int | None] | None = None
        while True:
            observation = await self._observe(watch)
            ended = observation.state.ended
            lines = await self._logs.lines(watch.cursor, tail_lines if previous is None else 0, final=ended)
            observation = replace(observation, new_log_lines=tuple(lines))
            current = (observation.state, observation.exit_code)
            if previous is None or lines or current != previous:
                yield observation
            previous = current
            if ended:
                return
            await asyncio.sleep(interval)

    def _job_for(self, ref: JobRef) -> _Job:
        job = self._jobs.get(ref.monitor_job_id)
        if job is None:
            raise NotFound("job", ref.monitor_job_id, field="job.monitor_job_id")
        known = job.record.ref
        if ref.kind and (
            (ref.kind, ref.pid, ref.host, ref.job_id) != (known.kind, known.pid, known.host, known.job_id)
            or ref.log_path not in ("", known.log_path)
        ):
            raise InvalidArgument([FieldViolation("job", f"is not the job {ref.monitor_job_id} names")])
        return job

    async def _watch_job(self, job: _Job, interval: float, tail_lines: int) -> AsyncIterator[JobObservation]:
        cursor = LogCursor(job.record.log_path, job.record.host)
        sent = 0  # the last metric point reported
        previous: tuple[JobState, int | None] | None = None
        while True:
            observation, changed = job.observation, job.changed
            ended = observation.state.ended
            lines = await self._logs.lines(cursor, tail_lines if previous is None else 0, final=ended)
            points, sent = job.tracker.points_after(sent)
            current = (observation.state, observation.exit_code)
            if previous is None or lines or points or current != previous:
                yield replace(observation, new_log_lines=tuple(lines), metric_points=points)
            previous = current
            if ended:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), interval)

    async def _observe(self, watch: _Watch) -> JobObservation:
        ref = watch.ref
        if ref.kind == "local":
            return self._observe_local(watch)
        if ref.kind == "remote":
            return await self._observe_remote(watch)
        return await self._observe_slurm(watch)

    def _observe_local(self, watch: _Watch) -> JobObservation:
        pid = watch.ref.pid
        child = self._children.get(pid)
        if child is not None:
            return _exit_observation(child.returncode)  # asyncio's child watcher sets it when the job ends
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return _gone(watch, f"process {pid}")
        except PermissionError:
            pass  # it exists, as another user's process
        watch.seen_alive = True
        return JobObservation(JobState.RUNNING, detail=f"process {pid} is alive")

    async def _observe_remote(self, watch: _Watch) -> JobObservation:
        ref = watch.ref
        result = await self._hosts.run(ref.host, f"kill -0 {int(ref.pid)} 2>&1; echo $?")
        *messages, status = result.stdout.strip().splitlines() or ["?"]
        if status == "0" or any("not permitted" in m.lower() for m in messages):
            watch.seen_alive = True
            return JobObservation(JobState.RUNNING, detail=f"process {ref.pid} on {ref.host} is alive")
        if status.isdigit():
            return _gone(watch, f"process {ref.pid} on {ref.host}")
        raise FailedPrecondition(f"cannot tell whether {ref.pid} runs on {ref.host}: {result.stdout!r}")

    async def _observe_slurm(self, watch: _Watch) -> JobObservation:
        ref = watch.ref
        elapsed = time.monotonic() - watch.started
        sacct = await self._hosts.run(ref.host, slurm.sacct_command(ref.job_id))
        found = None
        if sacct.exit_status == 0:
            found = _parsed(ref.host, lambda out: slurm.parse_sacct(out, ref.job_id), sacct.stdout)
        past_limit = (
            watch.time_limit is not None and elapsed > watch.time_limit + self._limits.time_limit_buffer_seconds
        )
        if found is None or (past_limit and not found.state.ended):
            queue = await self._hosts.run(ref.host, slurm.squeue_command(ref.job_id))
            queued = _parsed(ref.host, slurm.parse_squeue, queue.stdout) if queue.exit_status == 0 else None
            if found is not None and queued is None:  # accounting lags, or lost the job's end
                return JobObservation(JobState.UNKNOWN, detail=_RUNAWAY.format(state=found.state.value))
            found = queued or found
        if found is not None:
            watch.unknown_polls = 0
            watch.time_limit = found.time_limit_seconds or watch.time_limit
            return JobObservation(found.state, found.exit_code, found.detail)
        watch.unknown_polls += 1
        if watch.unknown_polls >= self._limits.unknown_polls or past_limit:
            return JobObservation(
                JobState.UNKNOWN,
                detail=f"neither sacct nor squeue on {ref.host} knows job {ref.job_id} after "
                f"{watch.unknown_polls} polls ({elapsed:.0f} s); given up",
            )
        return JobObservation(JobState.PENDING, detail=f"job {ref.job_id} is not listed yet")


_INTERRUPTED = "the monitor stopped while starting it, so whether it started is unknown"
_NOT_OURS = "its exit status is unknown, as the monitor was restarted while it ran"


def _new_record(
    kind: str, request_id: str, digest: str, options: JobOptions, argv: Sequence[str], command: Command
) -> JobRecord:
    return JobRecord(
        new_job_id(),
        request_id,
        digest,
        kind,
        host=command.host,
        argv=list(argv),
        working_directory=command.working_directory,
        environment_names=sorted(options.environment),
        wall_clock_limit=options.wall_clock_limit,
        metrics=list(options.metrics),
        workspace_id=options.workspace_id,
        detail="starting",
    )


def _workspace_host(record: WorkspaceRecord, named: str, kind: str) -> str:
    """The host a job in the workspace runs on ("" for this machine): the workspace's, which a request that
    names a host must name."""
    host = "" if record.host == LOCAL else record.host
    if kind == "local" and host:
        where = f"the workspace is on {host}: submit a remote command or a Slurm script there"
        raise InvalidArgument([FieldViolation("options.workspace_id", where)])
    if kind != "local" and not host:
        raise InvalidArgument(
            [FieldViolation("options.workspace_id", "the workspace is on this machine: submit a local command")]
        )
    if named and named != host:
        raise InvalidArgument(
            [FieldViolation(f"{kind}.host", f"the workspace is on {host}: name it, or leave this empty")]
        )
    return host


def _checked_options(options: JobOptions, working_directory: str) -> tuple[CompiledMetric, ...]:
    """The options' faults as field violations; the metrics compiled."""
    check_environment(options.environment)
    wall_clock_limit(options.wall_clock_limit)
    check_gpu_request(options.gpus)
    if options.gpus.wanted and "CUDA_VISIBLE_DEVICES" in options.environment:
        raise InvalidArgument(
            [FieldViolation("options.environment", "CUDA_VISIBLE_DEVICES is set by the monitor for a GPU request")]
        )
    return compile_metrics(options.metrics, working_directory=working_directory)


def _options_payload(options: JobOptions) -> dict[str, object]:
    """What of the options makes a submission another one (the environment's values included)."""
    return {
        "environment": dict(options.environment),
        "wall_clock_limit": options.wall_clock_limit,
        "gpus": asdict(options.gpus),
        "metrics": [asdict(spec) for spec in options.metrics],
        # Only when set: the digests of records written before workspaces stay valid.
        **({"workspace_id": options.workspace_id} if options.workspace_id else {}),
    }


def _gpu_environment(gpus: Sequence[int]) -> dict[str, str]:
    if not gpus:
        return {}
    # NVML numbers GPUs by PCI bus; CUDA's default order is another, unless told.
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _environment(extra: Mapping[str, str], gpus: Sequence[int]) -> dict[str, str]:
    """The monitor's environment without its own settings (its mesh credentials among them), plus the job's."""
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("QUARRY_")}
    return {**inherited, **extra, **_gpu_environment(gpus)}


def _status_path(record: JobRecord) -> str:
    return record.log_path + ".exit"


def _not_launched(host: str, record: JobRecord, words: list[str], stderr: str) -> QuarryError:
    verdict = words[0] if words else ""
    if verdict == "outside":
        return FailedPrecondition(
            f"{record.log_path} on {host} leads outside the directories logs may be written to",
            reason=ErrorReason.LOG_PATH_NOT_ALLOWED,
        )
    if verdict == "links":
        return FailedPrecondition(
            f"{record.log_path} on {host} has several links: it is not written as a log",
            reason=ErrorReason.LOG_PATH_NOT_ALLOWED,
        )
    if verdict == "other":
        return FailedPrecondition(
            f"{record.log_path} on {host} is not a regular file", reason=ErrorReason.LOG_UNREADABLE
        )
    if verdict == "missing":
        return FailedPrecondition(
            f"the directory of {record.log_path} does not exist on {host}", reason=ErrorReason.JOB_NOT_STARTED
        )
    if verdict == "nodir":
        return FailedPrecondition(
            f"cannot enter {record.working_directory} on {host}", reason=ErrorReason.JOB_NOT_STARTED
        )
    return FailedPrecondition(
        f"starting the job on {host} printed {' '.join(words)[:200]!r} {stderr.strip()[:200]}",
        reason=ErrorReason.JOB_NOT_STARTED,
    )


def _read_local_file(working_directory: str, relative: str) -> bytes | None:
    """A metrics file under the working directory (its last MAX_JSONL_BYTES), checked as a log is; None if it
    does not exist."""
    root = os.path.realpath(working_directory)
    descriptor = open_log(os.path.join(root, relative), [root], os.O_RDONLY)
    if descriptor is None:
        return None
    with open(descriptor, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        start = max(size - MAX_JSONL_BYTES, 0)
        handle.seek(start)
        return _whole_lines(handle.read(MAX_JSONL_BYTES), cut=start > 0)


def _whole_lines(data: bytes, *, cut: bool) -> bytes:
    """Without the first line when the data starts mid-line."""
    return data.partition(b"\n")[2] if cut else data


def _exit_observation(returncode: int | None) -> JobObservation:
    if returncode is None:
        return JobObservation(JobState.RUNNING, detail="running")
    if returncode == 0:
        return JobObservation(JobState.COMPLETED, 0, "exited with status 0")
    if returncode < 0:
        return JobObservation(JobState.FAILED, 128 - returncode, f"killed by signal {-returncode}")
    return JobObservation(JobState.FAILED, returncode, f"exited with status {returncode}")


def _gone(watch: _Watch, what: str) -> JobObservation:
    if watch.seen_alive:
        return JobObservation(JobState.EXITED, detail=f"{what} has ended; its exit status cannot be known")
    return JobObservation(JobState.NOT_FOUND, detail=f"{what} does not exist")


def _parsed(host: str, parse: Callable[[str], _T], output: str) -> _T:
    try:
        return parse(output)
    except MalformedOutput as error:
        raise FailedPrecondition(
            f"unexpected output on {host}: {error}", reason=ErrorReason.MALFORMED_OUTPUT
        ) from error
