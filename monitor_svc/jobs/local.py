"""Jobs on this machine: processes the monitor starts as its children, in their own session.

A job the monitor started keeps its real exit status while it is the monitor's child: a crash is
FAILED with its exit code, never "completed". After a restart it is a process the monitor did not
start, matched by its pid and start time; its end is then EXITED. Its log is written under the
monitor's job directory or a configured log root, opened as a log is read (never a FIFO, never a
hard link to a file elsewhere). A job runs in the sandbox (sandbox.py) unless the operator allows none.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from pathlib import Path

from monitor_svc.jobs import processes
from monitor_svc.jobs.executor import Follow, Hold, NotStarted, Prepared, Watch, exit_observation
from monitor_svc.jobs.files import read_local_file
from monitor_svc.jobs.records import JobRecord
from monitor_svc.jobs.sandbox import Sandbox
from monitor_svc.jobs.spec import Command, JobKind, JobObservation, JobOptions, JobRequest
from monitor_svc.jobs.submission import checked_command, checked_options, in_workspace_root, options_payload
from monitor_svc.logs import Logs, open_log
from monitor_svc.validation import MAX_PID
from monitor_svc.workspaces.operations import Workspaces
from quarry.errors import ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument
from quarry.vocabulary import JobRef, JobState

NOT_OURS = "its exit status is unknown, as the monitor was restarted while it ran"


class _Follow:
    """A local job: by its child process while the monitor that started it runs, else by its pid and start time."""

    def __init__(self, record: JobRecord, process: asyncio.subprocess.Process | None, sandboxed: bool) -> None:
        self._record = record
        self._process = process
        self._sandboxed = sandboxed

    async def poll(self, previous: JobObservation) -> JobObservation:
        record = self._record
        if self._process is not None:
            observation = exit_observation(self._process.returncode)  # asyncio's child watcher sets it at the end
            if observation.state.ended and self._sandboxed:
                # bwrap has ended with the job's first process; what the job left in the sandbox goes with it.
                await asyncio.to_thread(_end_group, record.pgid)
            return observation
        if await asyncio.to_thread(processes.is_running, record.pid, record.start_ticks):
            return JobObservation(JobState.RUNNING, detail=f"process {record.pid} is running")
        return JobObservation(JobState.EXITED, detail=f"process {record.pid} has ended; {NOT_OURS}")

    async def pause(self, seconds: float) -> None:
        if self._process is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._process.wait(), seconds)  # its end is seen at once


def _end_group(pgid: int) -> None:
    if processes.group_alive(pgid):
        processes.signal_group(pgid, signal.SIGKILL)


class LocalExecutor:
    kind = JobKind.LOCAL
    poll_seconds = 0.1

    def __init__(self, logs: Logs, workspaces: Workspaces, jobs_dir: Path, sandbox: Sandbox) -> None:
        self._logs = logs
        self._workspaces = workspaces
        self._jobs_dir = jobs_dir
        self._sandbox = sandbox
        self._children: dict[int, asyncio.subprocess.Process] = {}  # by pid: what a watch by pid finds
        # By monitor_job_id, until followed: the process and whether it runs in the sandbox.
        self._unattached: dict[str, tuple[asyncio.subprocess.Process, bool]] = {}
        self.groups = self

    async def prepare(self, request: JobRequest, options: JobOptions, request_id: str) -> Prepared:
        command, argv = checked_command(request, options, request_id, self.kind)
        # As the request says (a workspace's directory relative to its root): a retry is the same submission.
        payload = [self.kind, list(argv), command.working_directory, command.log_path, options_payload(options)]
        writable = command.working_directory  # the tree a sandboxed job may write
        if options.workspace_id:
            command, writable = await in_workspace_root(self._workspaces, command, options, self.kind)
        metrics = checked_options(options, command.working_directory)
        self._logs.check_path(command.log_path, "", "local.log_path")
        self._sandbox.check(
            argv,
            working_directory=command.working_directory,
            environment=options.environment,
            writable=writable,
            in_workspace=bool(options.workspace_id),
            isolate_network=options.isolate_network,
        )
        start = functools.partial(self._start, argv, command, writable, options)
        return Prepared(payload, argv, command.host, command.working_directory, metrics, start)

    async def _start(
        self,
        argv: tuple[str, ...],
        command: Command,
        writable: str,
        options: JobOptions,
        record: JobRecord,
        hold: Hold,
    ) -> JobObservation:
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
            async with hold(options.gpus):
                launch = self._sandbox.wrap(
                    argv,
                    writable=writable,
                    working_directory=command.working_directory,
                    gpus=record.gpus,
                    environment=options.environment,
                    isolate_network=options.isolate_network,
                )
                try:
                    process = await asyncio.create_subprocess_exec(
                        *launch.argv,
                        cwd=command.working_directory or None,
                        env=launch.environment,
                        stdout=descriptor,
                        stderr=asyncio.subprocess.STDOUT,
                        stdin=asyncio.subprocess.DEVNULL,
                        start_new_session=True,  # outlives the monitor; its group is the job's, to stop it whole
                    )
                except OSError as error:
                    raise NotStarted(
                        FailedPrecondition(
                            f"cannot start {argv[0]!r}: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
                        )
                    ) from error
        finally:
            os.close(descriptor)  # the job has its own copy
        self._children[process.pid] = process
        self._unattached[record.monitor_job_id] = (process, launch.sandboxed)
        # bwrap's, where sandboxed: its group holds the whole sandbox, and a restarted monitor finds it by these.
        record.pid = record.pgid = process.pid
        record.start_ticks = processes.start_ticks(process.pid)
        return JobObservation(JobState.RUNNING, detail=f"process {process.pid} started")

    def check_ref(self, ref: JobRef) -> None:
        if not 0 < ref.pid <= MAX_PID:
            raise InvalidArgument([FieldViolation(f"job.{self.kind}.pid", "a process id")])

    async def observe(self, watch: Watch) -> JobObservation:
        pid = watch.ref.pid
        child = self._children.get(pid)
        if child is not None:
            return exit_observation(child.returncode)  # asyncio's child watcher sets it when the job ends
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return watch.gone(f"process {pid}")
        except PermissionError:
            pass  # it exists, as another user's process
        watch.seen_alive = True
        return JobObservation(JobState.RUNNING, detail=f"process {pid} is alive")

    def attach(self, record: JobRecord) -> Follow:
        process, sandboxed = self._unattached.pop(record.monitor_job_id, (None, False))
        return _Follow(record, process, sandboxed)

    async def signal(self, record: JobRecord, number: signal.Signals) -> None:
        processes.signal_group(record.pgid, number)

    async def alive(self, record: JobRecord) -> bool:
        return await asyncio.to_thread(processes.group_alive, record.pgid)

    async def read_file(self, record: JobRecord, relative: str) -> bytes | None:
        return await asyncio.to_thread(read_local_file, record.working_directory, relative)
