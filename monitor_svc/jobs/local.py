"""Jobs on this machine: processes the monitor starts as its children, in their own session.

A job the monitor started keeps its real exit status while it is the monitor's child: a crash is
FAILED with its exit code, never "completed". Every job runs under a small reaper process
(reaper.py) that writes its exit status beside its log when it ends, so a monitor restarted while
the job ran, which follows it by its pid and start time, still learns how it ended; only a job
whose status file is missing (its group was SIGKILLed) ends EXITED, its status unknown. Its log is written under the
monitor's job directory or a configured log root, opened as a log is read (never a FIFO, never a
hard link to a file elsewhere). A job runs in the sandbox (sandbox.py) unless the operator allows none;
its output reaches the log through a relay process (monitor_svc/log_relay.py) that caps the log and
stops the job before the disk fills.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from monitor_svc import log_relay
from monitor_svc.jobs import processes
from monitor_svc.jobs.executor import Follow, Hold, NotStarted, Prepared, Watch, exit_observation
from monitor_svc.jobs.files import read_local_file
from monitor_svc.jobs.records import JobRecord
from monitor_svc.jobs.sandbox import Sandbox, protected_in
from monitor_svc.jobs.spec import Command, JobKind, JobObservation, JobOptions, JobRequest
from monitor_svc.jobs.submission import checked_command, checked_options, in_workspace_root, options_payload
from monitor_svc.logs import Logs, open_log, relay_state
from monitor_svc.validation import MAX_PID
from monitor_svc.workspaces.operations import Workspaces
from quarry.errors import ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument
from quarry.vocabulary import JobRef, JobState

NOT_OURS = "its exit status is unknown, as the monitor was restarted while it ran"
# Beside a job's log: how it ended, as its reaper recorded it (a signal as its negative number).
EXIT_SUFFIX = ".exit"
_REAPER = str(Path(__file__).with_name("reaper.py"))
# Isolated (no PYTHON* variables, no user site) and without `site`: it needs nothing but os, signal and sys.
REAPER_FLAGS = ("-I", "-S")
_RELAY_WAIT_SECONDS = 5.0  # after the job's end, how long its relay gets to write the rest (a child may hold on)


@dataclass(frozen=True)
class LogLimits:
    """Bounds on a local job's log: its size (the middle is cut), and the free space left on its disk."""

    max_bytes: int = 1 << 30
    disk_reserve_bytes: int = 1 << 30


class _Follow:
    """A local job: by its child process while the monitor that started it runs, else by its pid and start time."""

    def __init__(self, record: JobRecord, logs: Logs, started: _Started | None) -> None:
        self._record = record
        self._logs = logs
        self._started = started

    async def poll(self, previous: JobObservation) -> JobObservation:
        record = self._record
        if self._started is not None:
            ended = exit_observation(self._started.job.returncode)  # asyncio's child watcher sets it at the end
            if ended.state.ended and self._started.sandboxed:
                # bwrap has ended with the job's first process; what the job left in the sandbox goes with it.
                await asyncio.to_thread(_end_group, record.pgid)
        elif await asyncio.to_thread(processes.is_running, record.pid, record.start_ticks):
            return JobObservation(JobState.RUNNING, detail=f"process {record.pid} is running")
        else:
            ended = await asyncio.to_thread(_recorded_end, record)
        if not ended.state.ended:
            return ended
        # The rest of its output is in the log once the relay has ended.
        if self._started is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._started.relay.wait(), _RELAY_WAIT_SECONDS)
        elif record.relay_pid:  # started by an earlier monitor: the relay is no child of this one
            await asyncio.to_thread(_wait_for_relay, record)
        state = await asyncio.to_thread(relay_state, record.log_path, self._logs.local_roots)
        if state is not None and state.stopped:  # the relay killed it: a full disk, not the job's own fault
            return JobObservation(JobState.FAILED, ended.exit_code, state.stopped)
        return ended

    async def pause(self, seconds: float) -> None:
        if self._started is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._started.job.wait(), seconds)  # its end is seen at once


def _recorded_end(record: JobRecord) -> JobObservation:
    """How a job that ended while no monitor watched it ended, as its reaper recorded it."""
    try:
        recorded = Path(record.log_path + EXIT_SUFFIX).read_text()
        code = int(recorded)
    except (OSError, ValueError):
        return JobObservation(JobState.EXITED, detail=f"process {record.pid} has ended; {NOT_OURS}")
    observed = exit_observation(code)
    return JobObservation(observed.state, observed.exit_code, f"{observed.detail} (recorded by its reaper)")


def _runnable(program: str, working_directory: str, path: str) -> bool:
    """Whether exec would find `program` (the reaper execs it, so its absence would only show as status 127)."""
    if "/" in program:
        return os.access(os.path.join(working_directory, program), os.X_OK)
    return shutil.which(program, path=path or None) is not None


def _wait_for_relay(record: JobRecord) -> None:
    deadline = time.monotonic() + _RELAY_WAIT_SECONDS
    while time.monotonic() < deadline and processes.is_running(record.relay_pid, record.relay_start_ticks):
        time.sleep(0.05)


def _end_group(pgid: int) -> None:
    if processes.group_alive(pgid):
        processes.signal_group(pgid, signal.SIGKILL)


class LocalExecutor:
    kind = JobKind.LOCAL
    poll_seconds = 0.1

    def __init__(
        self, logs: Logs, workspaces: Workspaces, jobs_dir: Path, sandbox: Sandbox, limits: LogLimits | None = None
    ) -> None:
        self._logs = logs
        self._workspaces = workspaces
        self._jobs_dir = jobs_dir
        self._sandbox = sandbox
        self._limits = limits or LogLimits()
        self._children: dict[int, asyncio.subprocess.Process] = {}  # by pid: what a watch by pid finds
        self._unattached: dict[str, _Started] = {}  # by monitor_job_id, until followed
        self.groups = self

    async def prepare(self, request: JobRequest, options: JobOptions, request_id: str) -> Prepared:
        command, argv = checked_command(request, options, request_id, self.kind)
        # As the request says (a workspace's directory relative to its root): a retry is the same submission.
        payload = [self.kind, list(argv), command.working_directory, command.log_path, options_payload(options)]
        writable = command.working_directory  # the tree a sandboxed job may write
        protected: tuple[str, ...] = ()  # rules of paths in it the job may not write
        if options.workspace_id:
            command, workspace = await in_workspace_root(self._workspaces, command, options, self.kind)
            writable, protected = workspace.root, workspace.protected_paths
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
        start = functools.partial(self._start, argv, command, (writable, protected), options)
        return Prepared(payload, argv, command.host, command.working_directory, metrics, start)

    async def _start(
        self,
        argv: tuple[str, ...],
        command: Command,
        tree: tuple[str, tuple[str, ...]],
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
        writable, rules = tree
        read_only = await asyncio.to_thread(protected_in, writable, rules) if rules else []
        output = await asyncio.to_thread(_LogOutput.open, log_file, self._logs.local_roots)
        try:
            async with hold(options.gpus):
                launch = self._sandbox.wrap(
                    argv,
                    writable=writable,
                    read_only=read_only,
                    working_directory=command.working_directory,
                    gpus=record.gpus,
                    environment=options.environment,
                    isolate_network=options.isolate_network,
                )
                if not _runnable(launch.argv[0], command.working_directory, launch.environment.get("PATH", "")):
                    raise NotStarted(
                        FailedPrecondition(
                            f"cannot start {launch.argv[0]!r}: not found, or not executable",
                            reason=ErrorReason.JOB_NOT_STARTED,
                        )
                    )
                status_file = str(log_file) + EXIT_SUFFIX
                await asyncio.to_thread(Path(status_file).unlink, missing_ok=True)  # an earlier job's, same log
                try:
                    process = await asyncio.create_subprocess_exec(
                        sys.executable,
                        *REAPER_FLAGS,
                        _REAPER,
                        status_file,
                        *launch.argv,
                        cwd=command.working_directory or None,
                        env=launch.environment,
                        stdout=output.job_end,
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
                relay = await output.relay(process.pid, self._limits)
        finally:
            output.close()  # the job and its relay have their own copies
        self._children[process.pid] = process
        self._unattached[record.monitor_job_id] = _Started(process, relay, launch.sandboxed)
        # bwrap's, where sandboxed: its group holds the whole sandbox, and a restarted monitor finds it by these.
        record.pid = record.pgid = process.pid
        record.start_ticks = processes.start_ticks(process.pid)
        record.relay_pid, record.relay_start_ticks = relay.pid, processes.start_ticks(relay.pid)
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
        return _Follow(record, self._logs, self._unattached.pop(record.monitor_job_id, None))

    async def signal(self, record: JobRecord, number: signal.Signals) -> None:
        processes.signal_group(record.pgid, number)

    async def alive(self, record: JobRecord) -> bool:
        return await asyncio.to_thread(processes.group_alive, record.pgid)

    async def read_file(self, record: JobRecord, relative: str) -> bytes | None:
        return await asyncio.to_thread(read_local_file, record.working_directory, relative)


@dataclass(frozen=True)
class _Started:
    job: asyncio.subprocess.Process
    relay: asyncio.subprocess.Process
    sandboxed: bool  # bwrap's group: what the job leaves behind is ended with it


@dataclass(frozen=True)
class _LogOutput:
    """A job's output on its way to its log: the pipe the job writes, and the log and state file its relay
    writes. The job stays the monitor's child (its exit status is its own); the relay is a second child, in a
    session of its own so that it outlives the monitor too, and ends when the job's last writer does."""

    log: int
    state: int
    job_end: int  # the pipe's write end: the job's stdout and stderr
    relay_end: int

    @classmethod
    def open(cls, log_file: Path, roots: Sequence[str]) -> _LogOutput:
        # Created, or appended to if it is a regular file with one link: never a FIFO (which would block
        # until a reader came) nor a hard link to a file elsewhere. Read and written: a cut rewrites it.
        log = open_log(str(log_file), roots, os.O_RDWR | os.O_CREAT)
        state = None
        try:
            state = open_log(str(log_file) + log_relay.STATE_SUFFIX, roots, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            if log is None or state is None:  # O_CREAT made them, unless their directory went away meanwhile
                raise FailedPrecondition(f"cannot write the log {log_file}", reason=ErrorReason.JOB_NOT_STARTED)
            try:  # allocated now: the relay rewrites it in place, which a full disk cannot refuse
                os.pwrite(state, b" " * log_relay.STATE_BYTES, 0)
            except OSError as error:
                raise FailedPrecondition(
                    f"cannot write the log {log_file}: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
                ) from error
            relay_end, job_end = os.pipe()
        except BaseException:
            for descriptor in (log, state):
                if descriptor is not None:
                    os.close(descriptor)
            raise
        return cls(log, state, job_end, relay_end)

    async def relay(self, pgid: int, limits: LogLimits) -> asyncio.subprocess.Process:
        """The relay of the job of group `pgid`; without one, the job is killed (its output would go nowhere)."""
        arguments = ["--log-fd", self.log, "--state-fd", self.state, "--pgid", pgid]
        arguments += ["--max-bytes", limits.max_bytes, "--reserve-bytes", limits.disk_reserve_bytes]
        try:
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",  # the standard library only: no PYTHON* variable of the monitor's steers it
                log_relay.__file__,
                *map(str, arguments),
                stdin=self.relay_end,
                stdout=asyncio.subprocess.DEVNULL,
                pass_fds=(self.log, self.state),
                env={"PATH": os.environ.get("PATH", os.defpath)},
                cwd="/",
                start_new_session=True,
            )
        except OSError as error:
            processes.signal_group(pgid, signal.SIGKILL)
            raise NotStarted(
                FailedPrecondition(
                    f"cannot start the relay of the job's log: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
                )
            ) from error

    def close(self) -> None:
        for descriptor in (self.log, self.state, self.job_end, self.relay_end):
            os.close(descriptor)
