"""Jobs on configured SSH hosts: processes started in their own session by a small sh wrapper.

The monitor cannot wait for a process on another machine, so the wrapper leaves the job's exit
status next to its log; a job whose status never appears has ended without one (killed by a
signal?), which is EXITED. The log goes under one of the host's log roots. Any other process on a
host can only be seen alive or gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import posixpath
import signal

from monitor_svc.jobs import processes
from monitor_svc.jobs.executor import (
    INTERRUPTED,
    Follow,
    Hold,
    NotStarted,
    Prepared,
    StartUnknown,
    Watch,
    exit_observation,
)
from monitor_svc.jobs.files import read_remote_file
from monitor_svc.jobs.records import JobRecord
from monitor_svc.jobs.spec import Command, JobKind, JobObservation, JobOptions, JobRequest
from monitor_svc.jobs.submission import checked_command, checked_options, gpu_environment, in_workspace, options_payload
from monitor_svc.logs import Logs
from monitor_svc.ssh import CommandResult, SshHosts
from monitor_svc.validation import MAX_PID
from monitor_svc.workspaces.operations import Workspaces
from quarry.errors import ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument, QuarryError, Unavailable
from quarry.vocabulary import JobRef, JobState

log = logging.getLogger(__name__)


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


async def run_start(hosts: SshHosts, host: str, command: str, what: str, maybe: str) -> CommandResult:
    """Run the command that starts a job on a host. If it fails midway the job may have started: it is given
    up (StartUnknown), never started again for its request_id."""
    try:
        return await hosts.run(host, command)
    except QuarryError as error:
        midway = Unavailable(f"{what} failed midway ({error}); {maybe}")
        raise StartUnknown(f"{INTERRUPTED}: {error}", midway) from error


class _Follow:
    """A job on a host: its process (pid and start time) and the exit status its wrapper leaves."""

    def __init__(self, hosts: SshHosts, record: JobRecord) -> None:
        self._hosts = hosts
        self._record = record

    async def poll(self, previous: JobObservation) -> JobObservation:
        record = self._record
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
            return exit_observation(int(status))
        if running is None:
            log.warning("job %s on %s: unexpected output %r", record.monitor_job_id, record.host, result.stdout[:200])
            return previous
        if running:
            return JobObservation(JobState.RUNNING, detail=f"process {record.pid} on {record.host} is running")
        return JobObservation(
            JobState.EXITED,
            detail=f"process {record.pid} on {record.host} has ended without an exit status (killed by a signal?)",
        )

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class SshExecutor:
    kind = JobKind.REMOTE
    poll_seconds = 0.5

    def __init__(self, hosts: SshHosts, logs: Logs, workspaces: Workspaces) -> None:
        self._hosts = hosts
        self._logs = logs
        self._workspaces = workspaces
        self.groups = self

    async def prepare(self, request: JobRequest, options: JobOptions, request_id: str) -> Prepared:
        command, argv = checked_command(request, options, request_id, self.kind)
        payload = [
            self.kind,
            command.host,
            list(argv),
            command.working_directory,
            command.log_path,
            options_payload(options),
        ]
        if options.workspace_id:
            command = await in_workspace(self._workspaces, command, options, self.kind)
        self._hosts.require(command.host, field="remote.host")
        if command.working_directory and not posixpath.isabs(command.working_directory):
            raise InvalidArgument([FieldViolation("remote.working_directory", "an absolute path")])
        metrics = checked_options(options, command.working_directory)
        if not self._logs.host_roots(command.host):
            raise FailedPrecondition(
                f"{command.host} has no log_roots: its jobs' logs must go under one",
                reason=ErrorReason.LOG_PATH_NOT_ALLOWED,
            )
        self._logs.check_path(command.log_path, command.host, "remote.log_path")
        start = functools.partial(self._start, argv, command, options)
        return Prepared(payload, argv, command.host, command.working_directory, metrics, start)

    async def _start(
        self, argv: tuple[str, ...], command: Command, options: JobOptions, record: JobRecord, hold: Hold
    ) -> JobObservation:
        host = command.host
        roots = self._logs.host_roots(host)
        record.log_path = command.log_path or posixpath.join(roots[0], f"{record.monitor_job_id}.log")
        await self._hosts.connect(host)  # unreachable: refused before anything is recorded
        async with hold(options.gpus):
            launch = processes.remote_launch(
                argv,
                command.working_directory,
                {**options.environment, **gpu_environment(record.gpus)},
                record.log_path,
                _status_path(record),
                roots,
            )
            result = await run_start(self._hosts, host, launch, f"starting the job on {host}", "it may have started")
            words = (result.stdout.strip().splitlines() or ["?"])[-1].split()
            started = words[:1] == ["started"] and words[1:2] != [] and words[1].isdigit()
            if result.exit_status != 0 or not started:
                raise NotStarted(_not_launched(host, record, words, result.stderr))
        record.pid = record.pgid = int(words[1])
        record.start_ticks = int(words[2]) if len(words) > 2 and words[2].isdigit() else None
        return JobObservation(JobState.RUNNING, detail=f"process {record.pid} on {host} started")

    def check_ref(self, ref: JobRef) -> None:
        violations = []
        if not 0 < ref.pid <= MAX_PID:
            violations.append(FieldViolation(f"job.{self.kind}.pid", "a process id"))
        if not ref.host:
            violations.append(FieldViolation(f"job.{self.kind}.host", "required: a configured host"))
        if violations:
            raise InvalidArgument(violations)

    async def observe(self, watch: Watch) -> JobObservation:
        ref = watch.ref
        result = await self._hosts.run(ref.host, f"kill -0 {int(ref.pid)} 2>&1; echo $?")
        *messages, status = result.stdout.strip().splitlines() or ["?"]
        if status == "0" or any("not permitted" in m.lower() for m in messages):
            watch.seen_alive = True
            return JobObservation(JobState.RUNNING, detail=f"process {ref.pid} on {ref.host} is alive")
        if status.isdigit():
            return watch.gone(f"process {ref.pid} on {ref.host}")
        raise FailedPrecondition(f"cannot tell whether {ref.pid} runs on {ref.host}: {result.stdout!r}")

    def attach(self, record: JobRecord) -> Follow:
        return _Follow(self._hosts, record)

    async def signal(self, record: JobRecord, number: signal.Signals) -> None:
        with contextlib.suppress(QuarryError):  # an unreachable host: the look that follows says the group lives on
            await self._hosts.run(record.host, processes.remote_signal_group(record.pgid, number.name[3:]))

    async def alive(self, record: JobRecord) -> bool:
        try:
            result = await self._hosts.run(record.host, processes.remote_group_alive(record.pgid))
        except QuarryError:
            return True
        return result.stdout.strip() != "gone"

    async def read_file(self, record: JobRecord, relative: str) -> bytes | None:
        return await read_remote_file(self._logs, record.host, record.working_directory, relative)
