"""Slurm jobs: submitted with sbatch on a configured login host, followed through sacct and squeue.

Slurm's sacct is the authority on a job's state (parsed strictly), squeue the fallback while sacct
has no record; a job neither knows is given up as UNKNOWN after a number of polls or once its time
limit plus a buffer has passed. Slurm stops its own jobs at --time, so the monitor never signals
them. A job's output (--output) goes under its host's first log root, where it is read as a remote
job's log is.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import posixpath
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from monitor_svc.jobs.executor import Follow, Hold, NotStarted, Prepared, StartUnknown, Watch
from monitor_svc.jobs.files import read_remote_file
from monitor_svc.jobs.records import JobRecord
from monitor_svc.jobs.spec import BatchScript, JobKind, JobObservation, JobOptions, JobRequest
from monitor_svc.jobs.ssh import run_start
from monitor_svc.jobs.submission import checked_options, options_payload, workspace_host
from monitor_svc.logs import Logs
from monitor_svc.smi import MalformedOutput
from monitor_svc.ssh import SshHosts, quote
from monitor_svc.validation import refuse_nul
from monitor_svc.workspaces.operations import Workspaces
from quarry.errors import ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument, Unavailable
from quarry.vocabulary import JobRef, JobState

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_JOB_ID = re.compile(r"\d+(_\d+)?")


# Slurm's states (sacct and squeue spell them the same), by what they mean for a watcher.
_STATES = {
    "PENDING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "CONFIGURING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "PREEMPTED": JobState.FAILED,
    "REVOKED": JobState.CANCELLED,
    "SPECIAL_EXIT": JobState.FAILED,
    "TIMEOUT": JobState.TIMED_OUT,
    "CANCELLED": JobState.CANCELLED,
}

SACCT_FORMAT = "JobID,State,ExitCode,Timelimit"


@dataclass(frozen=True)
class SlurmObservation:
    state: JobState
    exit_code: int | None = None
    detail: str = ""
    time_limit_seconds: float | None = None


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"{job_id!r} is not a Slurm job id")
    return job_id


def sacct_command(job_id: str) -> str:
    return f"sacct -j {check_job_id(job_id)} --format={SACCT_FORMAT} --parsable2 --noheader"


def squeue_command(job_id: str) -> str:
    return f"squeue -j {check_job_id(job_id)} --noheader --format=%T"


def _state(word: str, line: str) -> JobState:
    # sacct writes e.g. "CANCELLED by 1000"; a trailing "+" marks a truncated name.
    name = word.split()[0].rstrip("+") if word.strip() else ""
    if name not in _STATES:
        raise MalformedOutput(f"unknown Slurm state {word!r} in line {line!r}")
    return _STATES[name]


def parse_time_limit(text: str) -> float | None:
    """Slurm's [days-]hours:minutes:seconds (or minutes, or mm:ss); None for UNLIMITED or blank."""
    value = text.strip()
    if not value or value.upper() in ("UNLIMITED", "PARTITION_LIMIT", "INVALID"):
        return None
    days = 0
    if "-" in value:
        day_text, value = value.split("-", 1)
        days = int(day_text)
    parts = [int(part) for part in value.split(":")]
    if len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = parts[-3:]
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def format_time_limit(seconds: float) -> str:
    """A --time value: days-hours:minutes:seconds, whole seconds rounded up."""
    days, rest = divmod(math.ceil(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, whole = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{whole:02d}"


def parse_sacct(output: str, job_id: str) -> SlurmObservation | None:
    """The job's own line (not its .batch/.extern steps); None when sacct does not list it (yet)."""
    for line in output.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != 4:
            raise MalformedOutput(f"expected {SACCT_FORMAT} separated by '|', got {line!r}")
        found_id, state_text, exit_text, limit_text = fields
        if found_id != job_id:
            continue
        state = _state(state_text, line)
        code_text, _, signal_text = exit_text.partition(":")
        if not code_text.isdigit() or not signal_text.isdigit():
            raise MalformedOutput(f"ExitCode is {exit_text!r}, not CODE:SIGNAL, in line {line!r}")
        code, signal = int(code_text), int(signal_text)
        detail = f"Slurm state {state_text}"
        exit_code: int | None = None
        if signal:
            detail += f", killed by signal {signal}"
            exit_code = 128 + signal  # as a shell reports a signal
        elif code or state in (JobState.COMPLETED, JobState.FAILED):
            exit_code = code  # a timed-out or cancelled job's 0 says nothing, so it is left unset
        if not state.ended:
            exit_code = None
        if state is JobState.COMPLETED and (code or signal):
            state = JobState.FAILED  # Slurm can say COMPLETED for a step that exited non-zero
        try:
            limit = parse_time_limit(limit_text)
        except ValueError:
            raise MalformedOutput(f"Timelimit is {limit_text!r} in line {line!r}") from None
        return SlurmObservation(state, exit_code, detail, limit)
    return None


def parse_squeue(output: str) -> SlurmObservation | None:
    """squeue lists only jobs still in the queue: its state, or None when the job is not there.

    An array job lists one line per task: it runs while any task runs, else waits while any waits.
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return None
    states = [_state(line, line) for line in lines]
    for wanted in (JobState.RUNNING, JobState.PENDING):
        if wanted in states:
            return SlurmObservation(
                wanted, detail=f"Slurm state {wanted.value.upper()} (from squeue, {len(lines)} line(s))"
            )
    return SlurmObservation(states[0], detail=f"Slurm state {lines[0]} (from squeue)")


def parse_sbatch(output: str) -> str:
    """`sbatch --parsable` prints "JOBID" or "JOBID;CLUSTER"."""
    text = output.strip().split(";", 1)[0]
    if not _JOB_ID.fullmatch(text):
        raise MalformedOutput(f"sbatch --parsable printed {output.strip()!r}, not a job id")
    return text


# A job accounting says is still running, though the queue has forgotten it past its time limit, is given up.
_RUNAWAY = "sacct still says {state}, but squeue no longer lists the job, past its time limit; given up"


@dataclass(frozen=True)
class SlurmLimits:
    unknown_polls: int = 30
    time_limit_buffer_seconds: float = 600.0


def _parsed(host: str, parse: Callable[[str], _T], output: str) -> _T:
    try:
        return parse(output)
    except MalformedOutput as error:
        raise FailedPrecondition(
            f"unexpected output on {host}: {error}", reason=ErrorReason.MALFORMED_OUTPUT
        ) from error


class _Follow:
    """A Slurm job the monitor submitted: what sacct and squeue say, poll by poll."""

    def __init__(self, executor: SlurmExecutor, record: JobRecord) -> None:
        self._executor = executor
        self._record = record
        self._watch = Watch.of(record.ref)

    async def poll(self, previous: JobObservation) -> JobObservation:
        try:
            return await self._executor.observe(self._watch)
        except Unavailable as error:  # the login host is unreachable for now: the job is as it was
            log.warning("job %s on %s: %s", self._record.monitor_job_id, self._record.host, error)
            return previous

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class SlurmExecutor:
    kind = JobKind.SLURM
    groups = None  # Slurm stops its jobs at --time

    def __init__(self, hosts: SshHosts, logs: Logs, workspaces: Workspaces, limits: SlurmLimits) -> None:
        self._hosts = hosts
        self._logs = logs
        self._workspaces = workspaces
        self._limits = limits

    async def prepare(self, request: JobRequest, options: JobOptions, request_id: str) -> Prepared:
        if not isinstance(request, BatchScript):
            raise TypeError("a Slurm job runs a batch script")
        host, script_path, sbatch_args = request.host, request.script_path, request.sbatch_args
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
        payload = [self.kind, host, script_path, list(sbatch_args), options_payload(options)]
        directory = ""
        if options.workspace_id:
            record, script_path = await self._workspaces.job_path(
                options.workspace_id, script_path, "slurm.script_path", directory=False
            )
            host, directory = workspace_host(record, host, self.kind), record.root
        self._hosts.require(host, field="slurm.host")
        if options.gpus.indices:
            raise InvalidArgument([FieldViolation("options.gpus.indices", "Slurm picks the GPUs: ask for a count")])
        # JSON-lines files are read in the workspace root, where the job starts; log patterns in its output.
        metrics = checked_options(options, directory)
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
            args.append(f"--time={format_time_limit(options.wall_clock_limit)}")
        if directory:
            args.append(f"--chdir={directory}")
        start = functools.partial(self._start, host, args, script_path, options)
        return Prepared(payload, (), host, directory, metrics, start)

    async def _start(
        self, host: str, args: list[str], script_path: str, options: JobOptions, record: JobRecord, hold: Hold
    ) -> JobObservation:
        roots = self._logs.host_roots(host)
        if roots:  # stdout and stderr, read as a remote job's log
            record.log_path = posixpath.join(roots[0], f"{record.monitor_job_id}.log")
            args = [*args, f"--output={record.log_path}"]
        prefix = ["env", *(f"{name}={value}" for name, value in options.environment.items())]
        command = quote(*(prefix if options.environment else []), "sbatch", "--parsable", *args, script_path)
        async with hold(None):
            result = await run_start(self._hosts, host, command, f"sbatch on {host}", "the job may have been submitted")
            if result.exit_status != 0:
                output = result.stderr.strip() or result.stdout.strip()
                raise NotStarted(
                    FailedPrecondition(
                        f"sbatch on {host} failed ({result.exit_status}): {output}", reason=ErrorReason.SBATCH_FAILED
                    )
                )
            try:
                record.slurm_job_id = _parsed(host, parse_sbatch, result.stdout)
            except FailedPrecondition as error:
                raise StartUnknown(f"sbatch printed {result.stdout!r}", error) from error
        return JobObservation(JobState.PENDING, detail="submitted to Slurm")

    def check_ref(self, ref: JobRef) -> None:
        try:
            check_job_id(ref.job_id)
        except ValueError as error:
            raise InvalidArgument([FieldViolation(f"job.{self.kind}.job_id", str(error))]) from None
        if not ref.host:
            raise InvalidArgument([FieldViolation(f"job.{self.kind}.host", "required: the login host sacct runs on")])

    async def observe(self, watch: Watch) -> JobObservation:
        ref = watch.ref
        elapsed = time.monotonic() - watch.started
        sacct = await self._hosts.run(ref.host, sacct_command(ref.job_id))
        found = None
        if sacct.exit_status == 0:
            found = _parsed(ref.host, lambda out: parse_sacct(out, ref.job_id), sacct.stdout)
        past_limit = (
            watch.time_limit is not None and elapsed > watch.time_limit + self._limits.time_limit_buffer_seconds
        )
        if found is None or (past_limit and not found.state.ended):
            queue = await self._hosts.run(ref.host, squeue_command(ref.job_id))
            queued = _parsed(ref.host, parse_squeue, queue.stdout) if queue.exit_status == 0 else None
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

    def attach(self, record: JobRecord) -> Follow:
        return _Follow(self, record)

    async def read_file(self, record: JobRecord, relative: str) -> bytes | None:
        return await read_remote_file(self._logs, record.host, record.working_directory, relative)
