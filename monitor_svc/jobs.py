"""Jobs the monitor watches: local processes, processes on SSH hosts, and Slurm jobs. No model is involved.

A local job the monitor started keeps its real exit status (its process is
our child): a crash is FAILED with its exit code, never "completed". Any other
process can only be seen alive or gone, so its end is EXITED. Slurm's sacct is
the authority on a job's state, squeue the fallback while sacct has no record;
a job neither knows is given up as UNKNOWN after a number of polls or once its
time limit plus a buffer has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from monitor_svc import slurm
from monitor_svc.model import JobObservation, JobState
from monitor_svc.smi import MalformedOutput
from monitor_svc.ssh import SshHosts, quote
from quarry.errors import FailedPrecondition, FieldViolation, InvalidArgument

_T = TypeVar("_T")
MAX_NEW_LINES = 1000  # per poll, so a runaway log cannot flood a stream
_TAIL_BYTES = 256 * 1024


@dataclass(frozen=True)
class JobRef:
    kind: str  # "local", "remote" or "slurm"
    pid: int = 0
    host: str = ""
    job_id: str = ""
    log_path: str = ""


@dataclass(frozen=True)
class SlurmLimits:
    unknown_polls: int = 30
    time_limit_buffer_seconds: float = 600.0


@dataclass
class _Watch:
    """What one WatchJob remembers between polls."""

    ref: JobRef
    started: float = field(default_factory=time.monotonic)
    seen_alive: bool = False
    unknown_polls: int = 0
    time_limit: float | None = None
    log_offset: int = 0  # bytes (local) or lines (remote)
    partial_line: str = ""


class Jobs:
    def __init__(self, hosts: SshHosts, jobs_dir: Path, limits: SlurmLimits) -> None:
        self._hosts = hosts
        self._jobs_dir = jobs_dir
        self._limits = limits
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._submitted: dict[str, JobRef] = {}  # by request_id
        self._submitting: dict[str, asyncio.Lock] = {}

    # -- submission -------------------------------------------------------------------------

    async def submit_local(self, argv: Sequence[str], cwd: str, log_path: str, request_id: str) -> JobRef:
        if not argv:
            raise InvalidArgument([FieldViolation("local.argv", "required: the program and its arguments")])
        return await self._once(request_id, lambda: self._start_local(argv, cwd, log_path))

    async def _start_local(self, argv: Sequence[str], cwd: str, log_path: str) -> JobRef:
        log_file = Path(log_path) if log_path else self._jobs_dir / f"job-{uuid.uuid4().hex[:12]}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as output:
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd or None,
                    stdout=output,
                    stderr=asyncio.subprocess.STDOUT,
                    stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True,  # outlives the monitor, and is not killed by its Ctrl-C
                )
            except OSError as error:
                raise FailedPrecondition(
                    f"cannot start {argv[0]!r}: {error.strerror}", reason="JOB_NOT_STARTED"
                ) from error
        self._children[process.pid] = process
        return JobRef("local", pid=process.pid, log_path=str(log_file))

    async def submit_slurm(self, host: str, script_path: str, sbatch_args: Sequence[str], request_id: str) -> JobRef:
        self._hosts.require(host, field="slurm.host")
        if not script_path:
            raise InvalidArgument([FieldViolation("slurm.script_path", "required: the batch script on the host")])

        async def submit() -> JobRef:
            result = await self._hosts.run(host, quote("sbatch", "--parsable", *sbatch_args, script_path))
            if result.exit_status != 0:
                raise FailedPrecondition(
                    f"sbatch on {host} failed ({result.exit_status}): {result.stderr.strip() or result.stdout.strip()}",
                    reason="SBATCH_FAILED",
                )
            return JobRef("slurm", host=host, job_id=_parsed(host, slurm.parse_sbatch, result.stdout))

        return await self._once(request_id, submit)

    async def _once(self, request_id: str, start: Callable[[], Awaitable[JobRef]]) -> JobRef:
        """Idempotent by request_id: a repeat returns the job the first call started."""
        if not request_id:
            raise InvalidArgument([FieldViolation("request_id", "required: a retry must not start a second job")])
        async with self._submitting.setdefault(request_id, asyncio.Lock()):
            if request_id not in self._submitted:
                self._submitted[request_id] = await start()
            return self._submitted[request_id]

    # -- watching ----------------------------------------------------------------------------

    async def watch(self, ref: JobRef, interval: float, tail_lines: int) -> AsyncIterator[JobObservation]:
        """The job's state and the last log lines, then every change (state or new lines) until it ends."""
        watch = _Watch(ref)
        previous: JobObservation | None = None
        first = True
        while True:
            observation = await self._observe(watch)
            lines = await self._log_lines(watch, tail_lines if first else 0, final=observation.state.ended)
            observation = replace(observation, new_log_lines=tuple(lines))
            changed = previous is None or (observation.state, observation.exit_code) != (
                previous.state,
                previous.exit_code,
            )
            if first or lines or changed:
                yield observation
            first, previous = False, observation
            if observation.state.ended:
                return
            await asyncio.sleep(interval)

    async def _observe(self, watch: _Watch) -> JobObservation:
        ref = watch.ref
        if ref.kind == "local":
            return await self._observe_local(watch)
        if ref.kind == "remote":
            return await self._observe_remote(watch)
        return await self._observe_slurm(watch)

    async def _observe_local(self, watch: _Watch) -> JobObservation:
        pid = watch.ref.pid
        child = self._children.get(pid)
        if child is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(child.wait()), 0.05)  # reap it if it has ended
            return _exit_observation(child.returncode)
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
        sacct = await self._hosts.run(ref.host, slurm.sacct_command(ref.job_id))
        found = None
        if sacct.exit_status == 0:
            found = _parsed(ref.host, lambda out: slurm.parse_sacct(out, ref.job_id), sacct.stdout)
        if found is None:
            queue = await self._hosts.run(ref.host, slurm.squeue_command(ref.job_id))
            found = _parsed(ref.host, slurm.parse_squeue, queue.stdout) if queue.exit_status == 0 else None
        if found is not None:
            watch.unknown_polls = 0
            watch.time_limit = found.time_limit_seconds or watch.time_limit
            return JobObservation(found.state, found.exit_code, found.detail)
        watch.unknown_polls += 1
        elapsed = time.monotonic() - watch.started
        past_limit = (
            watch.time_limit is not None and elapsed > watch.time_limit + self._limits.time_limit_buffer_seconds
        )
        if watch.unknown_polls >= self._limits.unknown_polls or past_limit:
            return JobObservation(
                JobState.UNKNOWN,
                detail=f"neither sacct nor squeue on {ref.host} knows job {ref.job_id} after "
                f"{watch.unknown_polls} polls ({elapsed:.0f} s); given up",
            )
        return JobObservation(JobState.PENDING, detail=f"job {ref.job_id} is not listed yet")

    # -- logs ---------------------------------------------------------------------------------

    async def _log_lines(self, watch: _Watch, tail_lines: int, *, final: bool) -> list[str]:
        """New lines since the last poll; on the first, the last `tail_lines` lines."""
        path = watch.ref.log_path
        if not path:
            return []
        if watch.ref.kind == "local":
            return await asyncio.to_thread(_read_local_log, watch, tail_lines, final)
        host = watch.ref.host
        if tail_lines:
            counted = await self._hosts.run(host, f"wc -l < {shlex.quote(path)}")
            if counted.exit_status != 0:
                return []  # not written yet
            watch.log_offset = int(counted.stdout.strip() or 0)
            shown = await self._hosts.run(host, quote("tail", "-n", str(tail_lines), path))
            return shown.stdout.splitlines()
        result = await self._hosts.run(
            host, f"tail -n +{watch.log_offset + 1} {shlex.quote(path)} 2>/dev/null | head -n {MAX_NEW_LINES}"
        )
        lines = result.stdout.splitlines()
        watch.log_offset += len(lines)
        return lines


def _read_local_log(watch: _Watch, tail_lines: int, final: bool) -> list[str]:
    """Complete lines written since the last read (the last `tail_lines` of them on the first read).

    An unfinished last line waits for its end, unless the job has ended (`final`).
    """
    try:
        with open(watch.ref.log_path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(size - _TAIL_BYTES, 0) if tail_lines else watch.log_offset
            handle.seek(start)
            data = handle.read(_TAIL_BYTES)
    except FileNotFoundError:
        return []
    watch.log_offset = start + len(data)
    lines = (watch.partial_line + data.decode(errors="replace")).split("\n")
    watch.partial_line = lines.pop()
    if final and watch.partial_line:
        lines.append(watch.partial_line)
        watch.partial_line = ""
    return lines[-tail_lines:] if tail_lines else lines[:MAX_NEW_LINES]


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
        raise FailedPrecondition(f"unexpected output on {host}: {error}", reason="MALFORMED_OUTPUT") from error
