"""Jobs the monitor watches: local processes, processes on SSH hosts, and Slurm jobs. No model is involved.

A local job the monitor started keeps its real exit status (its process is
our child): a crash is FAILED with its exit code, never "completed". Any other
process can only be seen alive or gone, so its end is EXITED. Slurm's sacct is
the authority on a job's state, squeue the fallback while sacct has no record;
a job neither knows is given up as UNKNOWN after a number of polls or once its
time limit plus a buffer has passed.

Log files are read only under configured roots (the monitor's own job
directory, and per host its `log_roots`): a path elsewhere is refused, so a
tool call cannot read, say, a private key.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import posixpath
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from monitor_svc import slurm
from monitor_svc.model import JobObservation
from monitor_svc.smi import MalformedOutput
from monitor_svc.ssh import SshHosts, quote
from monitor_svc.validation import refuse_nul
from quarry.errors import AlreadyExists, ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument
from quarry.vocabulary import JobRef, JobState

_T = TypeVar("_T")
MAX_LOG_BYTES_PER_POLL = 256 * 1024  # a runaway log cannot flood a stream or the monitor's memory
MAX_LINE_CHARS = 16 * 1024
_FINAL_READS = 16  # at most this many more reads when a job has ended (4 MiB of log)
# A job accounting says is still running, though the queue has forgotten it past its time limit, is given up.
_RUNAWAY = "sacct still says {state}, but squeue no longer lists the job, past its time limit; given up"


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
    log_offset: int = 0  # bytes read so far
    partial_line: str = ""


class Jobs:
    def __init__(self, hosts: SshHosts, jobs_dir: Path, limits: SlurmLimits, log_roots: Sequence[str] = ()) -> None:
        self._hosts = hosts
        self._jobs_dir = jobs_dir
        self._limits = limits
        self._log_roots = [os.path.realpath(root) for root in (str(jobs_dir), *log_roots)]
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._submitted: dict[str, tuple[str, asyncio.Task[JobRef]]] = {}  # request_id -> (digest, submission)

    # -- log paths ------------------------------------------------------------------------

    def check_log_path(self, ref: JobRef, field_name: str = "job.log_path") -> None:
        """Refuse a log path outside the configured roots (the monitor's job directory, a host's log_roots)."""
        path = ref.log_path
        if not path:
            return
        if not posixpath.isabs(path):
            raise InvalidArgument([FieldViolation(field_name, "an absolute path")])
        if ref.kind == "local":
            resolved, roots = os.path.realpath(path), self._log_roots
        else:
            resolved, roots = (
                posixpath.normpath(path),
                [posixpath.normpath(r) for r in self._hosts.require(ref.host).log_roots],
            )
        if not any(resolved == root or resolved.startswith(root.rstrip("/") + "/") for root in roots):
            where = "this machine" if ref.kind == "local" else ref.host
            allowed = ", ".join(roots) or "none are configured"
            raise FailedPrecondition(
                f"{path} on {where} is outside the directories logs may be read from ({allowed})",
                reason=ErrorReason.LOG_PATH_NOT_ALLOWED,
            )

    # -- submission -------------------------------------------------------------------------

    async def submit_local(self, argv: Sequence[str], cwd: str, log_path: str, request_id: str) -> JobRef:
        refuse_nul(
            {
                **{f"local.argv[{index}]": arg for index, arg in enumerate(argv)},
                "local.working_directory": cwd,
                "local.log_path": log_path,
                "request_id": request_id,
            }
        )
        if not argv:
            raise InvalidArgument([FieldViolation("local.argv", "required: the program and its arguments")])
        self.check_log_path(JobRef("local", log_path=log_path), "local.log_path")
        payload = ["local", list(argv), cwd, log_path]
        return await self._once(request_id, payload, lambda: self._start_local(argv, cwd, log_path))

    async def _start_local(self, argv: Sequence[str], cwd: str, log_path: str) -> JobRef:
        log_file = Path(log_path) if log_path else self._jobs_dir / f"job-{uuid.uuid4().hex[:12]}.log"
        try:
            await asyncio.to_thread(log_file.parent.mkdir, parents=True, exist_ok=True)
            output = await asyncio.to_thread(log_file.open, "ab")
        except OSError as error:
            raise FailedPrecondition(
                f"cannot write the log {log_file}: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
            ) from error
        with output:
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
                    f"cannot start {argv[0]!r}: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
                ) from error
        self._children[process.pid] = process
        return JobRef("local", pid=process.pid, log_path=str(log_file))

    async def submit_slurm(self, host: str, script_path: str, sbatch_args: Sequence[str], request_id: str) -> JobRef:
        refuse_nul(
            {
                "slurm.host": host,
                "slurm.script_path": script_path,
                **{f"slurm.sbatch_args[{index}]": arg for index, arg in enumerate(sbatch_args)},
                "request_id": request_id,
            }
        )
        self._hosts.require(host, field="slurm.host")
        if not script_path or script_path.startswith("-"):
            # Not an option in disguise: sbatch would read "-..." as one.
            raise InvalidArgument([FieldViolation("slurm.script_path", "required: the batch script on the host")])

        async def submit() -> JobRef:
            command = quote("sbatch", "--parsable", *sbatch_args, script_path)
            result = await self._hosts.run(host, command)
            if result.exit_status != 0:
                raise FailedPrecondition(
                    f"sbatch on {host} failed ({result.exit_status}): {result.stderr.strip() or result.stdout.strip()}",
                    reason=ErrorReason.SBATCH_FAILED,
                )
            return JobRef("slurm", host=host, job_id=_parsed(host, slurm.parse_sbatch, result.stdout))

        return await self._once(request_id, ["slurm", host, script_path, list(sbatch_args)], submit)

    async def _once(self, request_id: str, payload: object, start: Callable[[], Awaitable[JobRef]]) -> JobRef:
        """Idempotent by request_id: a repeat gets the job the first call started, even if that caller left."""
        if not request_id:
            raise InvalidArgument([FieldViolation("request_id", "required: a retry must not start a second job")])
        digest = hashlib.sha256(json.dumps(payload).encode()).hexdigest()
        if request_id not in self._submitted:
            # A task of its own: a caller that goes away (a deadline) does not undo a started submission.
            self._submitted[request_id] = (digest, asyncio.ensure_future(start()))
        known, submission = self._submitted[request_id]
        if known != digest:
            raise AlreadyExists(
                f"request_id {request_id!r} already started a different job", reason=ErrorReason.REQUEST_ID_REUSED
            )
        try:
            return await asyncio.shield(submission)
        except Exception:
            if self._submitted.get(request_id, (None, None))[1] is submission:
                del self._submitted[request_id]  # it failed: a retry may try again
            raise

    # -- watching ----------------------------------------------------------------------------

    async def watch(self, ref: JobRef, interval: float, tail_lines: int) -> AsyncIterator[JobObservation]:
        """The job's state and the last log lines, then every change (state or new lines) until it ends."""
        self.check_log_path(ref)
        watch = _Watch(ref)
        previous: tuple[JobState, int | None] | None = None
        while True:
            observation = await self._observe(watch)
            ended = observation.state.ended
            lines = await self._log_lines(watch, tail_lines if previous is None else 0, final=ended)
            observation = replace(observation, new_log_lines=tuple(lines))
            current = (observation.state, observation.exit_code)
            if previous is None or lines or current != previous:
                yield observation
            previous = current
            if ended:
                return
            await asyncio.sleep(interval)

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

    # -- logs ---------------------------------------------------------------------------------

    async def _log_lines(self, watch: _Watch, tail_lines: int, *, final: bool) -> list[str]:
        """Complete lines written since the last read (the last `tail_lines` of them on the first read).

        Read by byte offset, split on newlines only; an unfinished last line waits for its end unless
        the job has ended. At most MAX_LOG_BYTES_PER_POLL a poll; on the last poll, the rest is read too.
        """
        if not watch.ref.log_path:
            return []
        data, size = await self._read_log(watch, tail_lines)
        lines = _split(watch, data, final=final and watch.log_offset >= size)
        if tail_lines:
            return lines[-tail_lines:]
        for _ in range(_FINAL_READS):  # the end of a finished job's log, however much came at the end
            if not (final and data and watch.log_offset < size):
                break
            data, size = await self._read_log(watch, 0)
            lines.extend(_split(watch, data, final=watch.log_offset >= size))
        return lines

    async def _read_log(self, watch: _Watch, tail_lines: int) -> tuple[bytes, int]:
        """(bytes from the offset, or the file's last chunk on a first read with a tail; the file's size)."""
        ref = watch.ref
        if ref.kind == "local":
            return await asyncio.to_thread(_read_local, watch, tail_lines)
        path = quote(ref.log_path)
        size_result = await self._hosts.run(ref.host, f"wc -c < {path} 2>/dev/null")
        if size_result.exit_status != 0 or not size_result.stdout.strip().isdigit():
            return b"", 0  # not written yet
        size = int(size_result.stdout.strip())
        if tail_lines:
            watch.log_offset = max(size - MAX_LOG_BYTES_PER_POLL, 0)
        if size < watch.log_offset:  # truncated or rotated: start again from its beginning
            watch.log_offset, watch.partial_line = 0, ""
        result = await self._hosts.run(
            ref.host, f"tail -c +{watch.log_offset + 1} -- {path} 2>/dev/null | head -c {MAX_LOG_BYTES_PER_POLL}"
        )
        watch.log_offset += len(result.raw_stdout)
        return result.raw_stdout, size


def _read_local(watch: _Watch, tail_lines: int) -> tuple[bytes, int]:
    try:
        with open(watch.ref.log_path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            if tail_lines:
                watch.log_offset = max(size - MAX_LOG_BYTES_PER_POLL, 0)
            if size < watch.log_offset:  # truncated or rotated
                watch.log_offset, watch.partial_line = 0, ""
            handle.seek(watch.log_offset)
            data = handle.read(MAX_LOG_BYTES_PER_POLL)
    except FileNotFoundError:
        return b"", 0
    except OSError as error:
        raise FailedPrecondition(
            f"cannot read {watch.ref.log_path}: {error.strerror}", reason=ErrorReason.LOG_UNREADABLE
        ) from error
    watch.log_offset += len(data)
    return data, size


def _split(watch: _Watch, data: bytes, *, final: bool) -> list[str]:
    lines = (watch.partial_line + data.decode(errors="replace")).split("\n")
    watch.partial_line = lines.pop()[-MAX_LINE_CHARS:]  # a line without end is kept, bounded
    if final and watch.partial_line:
        lines.append(watch.partial_line)
        watch.partial_line = ""
    return lines


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
