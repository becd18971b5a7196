"""Jobs the monitor watches: local processes, processes on SSH hosts, and Slurm jobs. No model is involved.

A local job the monitor started keeps its real exit status (its process is
our child): a crash is FAILED with its exit code, never "completed". Any other
process can only be seen alive or gone, so its end is EXITED. Slurm's sacct is
the authority on a job's state, squeue the fallback while sacct has no record;
a job neither knows is given up as UNKNOWN after a number of polls or once its
time limit plus a buffer has passed.

Log files are read only under configured roots (the monitor's own job
directory, and per host its `log_roots`): a path elsewhere is refused, so a
tool call cannot read, say, a private key. The path is resolved (symlinks
followed) and checked again at every read, on this machine and on a host, so a
link in a root to a file outside it is refused, even one made after the watch
began. Only regular files with one link are read or written (see
_check_log_file): a FIFO or a device is refused instead of blocking a thread or
an SSH session, and a hard link to a file elsewhere is refused like the file.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import posixpath
import stat
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
from quarry.errors import (
    AlreadyExists,
    ErrorReason,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    PermissionDenied,
)
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
    def __init__(
        self,
        hosts: SshHosts,
        jobs_dir: Path,
        limits: SlurmLimits,
        log_roots: Sequence[str] = (),
        *,
        allow_submission: bool = False,
    ) -> None:
        self._hosts = hosts
        self._allow_submission = allow_submission
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
        if not _within(resolved, roots):
            raise _outside(path, "this machine" if ref.kind == "local" else ref.host, roots)

    # -- submission -------------------------------------------------------------------------

    def _check_submission_allowed(self) -> None:
        # A job runs as the monitor's user; a deployment that wants that says so.
        if not self._allow_submission:
            raise PermissionDenied(
                "this monitor does not run jobs; set QUARRY_MONITOR_ALLOW_JOB_SUBMISSION=true to allow SubmitJob",
                reason=ErrorReason.JOB_SUBMISSION_DISABLED,
            )

    async def submit_local(self, argv: Sequence[str], cwd: str, log_path: str, request_id: str) -> JobRef:
        self._check_submission_allowed()
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
        except OSError as error:
            raise FailedPrecondition(
                f"cannot write the log {log_file}: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
            ) from error
        # Created, or appended to if it is a regular file with one link: never a FIFO (which would block
        # until a reader came) nor a hard link to a file elsewhere.
        descriptor = await asyncio.to_thread(
            _open_log, str(log_file), self._log_roots, os.O_WRONLY | os.O_APPEND | os.O_CREAT
        )
        if descriptor is None:  # O_CREAT made it, unless its directory went away meanwhile
            raise FailedPrecondition(f"cannot write the log {log_file}", reason=ErrorReason.JOB_NOT_STARTED)
        try:
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd or None,
                    stdout=descriptor,
                    stderr=asyncio.subprocess.STDOUT,
                    stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True,  # outlives the monitor, and is not killed by its Ctrl-C
                )
            except OSError as error:
                raise FailedPrecondition(
                    f"cannot start {argv[0]!r}: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
                ) from error
        finally:
            os.close(descriptor)  # the job has its own copy
        self._children[process.pid] = process
        return JobRef("local", pid=process.pid, log_path=str(log_file))

    async def submit_slurm(self, host: str, script_path: str, sbatch_args: Sequence[str], request_id: str) -> JobRef:
        self._check_submission_allowed()
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
            return await asyncio.to_thread(_read_local, watch, tail_lines, self._log_roots)
        roots = self._hosts.require(ref.host).log_roots
        result = await self._hosts.run(
            ref.host, _remote_read(ref.log_path, roots, watch.log_offset, tail=tail_lines > 0)
        )
        header, _, data = result.raw_stdout.partition(b"\n")
        verdict, *values = header.decode(errors="replace").split() or ["?"]
        if result.exit_status != 0 or verdict not in _REMOTE_VERDICTS or len(values) != _REMOTE_VERDICTS[verdict]:
            raise FailedPrecondition(
                f"unexpected output reading {ref.log_path} on {ref.host} (exit status {result.exit_status}): "
                f"{header[:200]!r} {result.stderr.strip()[:200]}",
                reason=ErrorReason.MALFORMED_OUTPUT,
            )
        if verdict == "missing":
            return b"", 0  # not written yet
        if verdict == "outside":
            raise _outside(ref.log_path, ref.host, roots, resolved=True)
        if verdict == "other":
            raise _not_regular(ref.log_path, ref.host, values[0])
        if verdict == "links":
            raise _linked(ref.log_path, ref.host, int(values[0]))
        size, start = int(values[0]), int(values[1])
        if start < watch.log_offset:  # truncated or rotated: start again from its beginning
            watch.partial_line = ""
        watch.log_offset = start + len(data)
        return data, size


# The remote side of _read_log, in POSIX sh with readlink -f (GNU coreutils, busybox): resolve the path and
# the roots on the host, refuse a path outside them, a file that is not regular (before opening it: a FIFO
# would block the session) and a file with several links (as _check_log_file does here), then print
# "ok SIZE START" and the bytes from START (the offset, or the last chunk for a tail; 0 once truncated).
# The tail runs under timeout(1) where the host has it: a file swapped for a FIFO after the checks ends
# the read at that bound (and otherwise at the SSH command timeout), not never.
_REMOTE_READ = """\
p=$(readlink -f -- {path}) && [ -e "$p" ] || {{ echo missing; exit 0; }}
inside=
for r in {roots}; do
  r=$(readlink -f -- "$r") || continue
  case $p in "$r"|"${{r%/}}"/*) inside=1;; esac
done
[ -n "$inside" ] || {{ echo outside; exit 0; }}
if [ ! -f "$p" ]; then
  if [ -p "$p" ]; then k=FIFO; elif [ -d "$p" ]; then k=directory; elif [ -S "$p" ]; then k=socket
  elif [ -c "$p" ] || [ -b "$p" ]; then k=device; else k=special; fi
  echo "other $k"; exit 0
fi
set -- $(ls -ldn -- "$p" | awk 'NR == 1 {{ print $2, $5 }}')
[ $# = 2 ] || {{ echo missing; exit 0; }}
[ "$1" = 1 ] || {{ echo "links $1"; exit 0; }}
size=$2 start={offset}
[ {tail} = 0 ] || {{ start=$((size - {chunk})); [ "$start" -gt 0 ] || start=0; }}
[ "$size" -ge "$start" ] || start=0
echo "ok $size $start"
t=; command -v timeout >/dev/null 2>&1 && t="timeout 10"
$t tail -c +$((start + 1)) -- "$p" 2>/dev/null | head -c {chunk}
"""
_REMOTE_VERDICTS = {"missing": 0, "outside": 0, "other": 1, "links": 1, "ok": 2}  # first word: how many values


def _remote_read(path: str, roots: Sequence[str], offset: int, *, tail: bool) -> str:
    return _REMOTE_READ.format(
        path=quote(path),
        roots=quote(*roots) if roots else "",
        offset=int(offset),
        tail=int(tail),
        chunk=MAX_LOG_BYTES_PER_POLL,
    )


def _within(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _outside(path: str, where: str, roots: Sequence[str], *, resolved: bool = False) -> FailedPrecondition:
    allowed = ", ".join(roots) or "none are configured"
    through = " through a symbolic link" if resolved else ""
    return FailedPrecondition(
        f"{path} on {where} leads{through} outside the directories logs may be read from ({allowed})",
        reason=ErrorReason.LOG_PATH_NOT_ALLOWED,
    )


def _not_regular(path: str, where: str, kind: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"{path} on {where} is not a regular file (a {kind}): only regular files are read as logs",
        reason=ErrorReason.LOG_UNREADABLE,
    )


def _linked(path: str, where: str, links: int) -> FailedPrecondition:
    return FailedPrecondition(
        f"{path} on {where} has {links} links: a file with several names may be one outside the log "
        "directories, so it is not read as a log",
        reason=ErrorReason.LOG_PATH_NOT_ALLOWED,
    )


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISDIR, "directory"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special"


def _check_log_file(path: str, info: os.stat_result) -> None:
    """Refuse what is not a regular file with exactly one link.

    Not regular: reading a FIFO blocks until someone writes, a device may never end. Several links: a
    hard link in a log root to a file elsewhere (a private key, another user's data) has the same inode
    as that file, so the path check cannot see it; with two names or more the file is refused. The rule
    is on the link count, not the owner: the files worth stealing (the monitor's SSH keys and settings)
    belong to the monitor's own user, so an owner check would let exactly those through. The monitor's
    own job logs are created by it with one link, and a job's log is rarely linked elsewhere; a log that
    is can be copied into a root instead.
    """
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, "this machine", _kind(info.st_mode))
    if info.st_nlink > 1:
        raise _linked(path, "this machine", info.st_nlink)


def _open_log(path: str, roots: Sequence[str], flags: int) -> int | None:
    """A descriptor for the log at `path` (None when there is none yet), checked and opened without blocking.

    The path is resolved and checked against the roots at every call; the resolved path is opened with
    O_NOFOLLOW (a symlink swapped in meanwhile fails) and O_NONBLOCK (a FIFO swapped in does not block),
    and what was opened is checked again (fstat), so what is read is what was checked.
    """
    resolved = os.path.realpath(path)
    if not _within(resolved, roots):
        raise _outside(path, "this machine", roots, resolved=True)
    try:
        if flags & os.O_CREAT == 0:
            _check_log_file(path, os.stat(resolved))  # refused before opening: opening a device can act
        descriptor = os.open(resolved, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:  # became a symlink after it was resolved
            raise _outside(path, "this machine", roots, resolved=True) from error
        if error.errno == errno.ENXIO:  # a FIFO opened for writing, without a reader
            raise _not_regular(path, "this machine", "FIFO") from error
        raise FailedPrecondition(
            f"cannot open the log {path}: {error.strerror}", reason=ErrorReason.LOG_UNREADABLE
        ) from error
    try:
        _check_log_file(path, os.fstat(descriptor))
        os.set_blocking(descriptor, True)  # a regular file: no change to reads, and a job's output is as usual
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _read_local(watch: _Watch, tail_lines: int, roots: Sequence[str]) -> tuple[bytes, int]:
    descriptor = _open_log(watch.ref.log_path, roots, os.O_RDONLY)
    if descriptor is None:
        return b"", 0
    try:
        with open(descriptor, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            if tail_lines:
                watch.log_offset = max(size - MAX_LOG_BYTES_PER_POLL, 0)
            if size < watch.log_offset:  # truncated or rotated
                watch.log_offset, watch.partial_line = 0, ""
            handle.seek(watch.log_offset)
            data = handle.read(MAX_LOG_BYTES_PER_POLL)
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
