"""Log files of jobs, read by byte offset on this machine or over SSH, only under configured roots.

Log files are read only under configured roots (the monitor's own job
directory, and per host its `log_roots`): a path elsewhere is refused, so a
tool call cannot read, say, a private key. The path is resolved (symlinks
followed) and checked again at every read, on this machine and on a host, so a
link in a root to a file outside it is refused, even one made after the watch
began. Only regular files with one link are read or written (see
_check_log_file): a FIFO or a device is refused instead of blocking a thread or
an SSH session, and a hard link to a file elsewhere is refused like the file.

A local job's log is rewritten when its relay cuts the middle (monitor_svc/log_relay.py): a reader
past the head then goes on in the kept tail, where the output it had not read yet is, as the relay's
state file says (a log that shrank otherwise, truncated or replaced, is read from 0).
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from monitor_svc.log_relay import STATE_BYTES, STATE_SUFFIX, RelayState, parse_state
from monitor_svc.ssh import SshHosts, quote
from quarry.errors import ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument

MAX_LOG_BYTES_PER_POLL = 256 * 1024  # a runaway log cannot flood a stream or the monitor's memory
MAX_LINE_CHARS = 16 * 1024
_FINAL_READS = 16  # at most this many more reads when a job has ended (4 MiB of log)


@dataclass
class LogCursor:
    """Where a reader is in one log (on this machine when host is ""): bytes read so far, an unfinished line."""

    path: str
    host: str = ""
    offset: int = 0
    partial_line: str = ""
    shift: int = 0  # in the tail of a log its relay cut: the position in the job's output less `offset`
    cuts_seen: int = 0  # the bytes its relay had cut in all when the cursor last read it


@dataclass(frozen=True)
class Chunk:
    """Bytes of a file from `start`, and the file's size then."""

    data: bytes
    size: int
    start: int
    exists: bool = True


class Logs:
    def __init__(self, hosts: SshHosts, local_roots: Sequence[str]) -> None:
        self._hosts = hosts
        self.local_roots = [os.path.realpath(root) for root in local_roots]

    def check_path(self, path: str, host: str, field_name: str) -> None:
        """Refuse a log path outside the configured roots (this machine's, or the host's log_roots)."""
        if not path:
            return
        if not posixpath.isabs(path):
            raise InvalidArgument([FieldViolation(field_name, "an absolute path")])
        if not host:
            resolved, roots = os.path.realpath(path), self.local_roots
        else:
            resolved, roots = posixpath.normpath(path), self.host_roots(host)
        if not _within(resolved, roots):
            raise _outside(path, host or "this machine", roots)

    def host_roots(self, host: str) -> list[str]:
        return [posixpath.normpath(root) for root in self._hosts.require(host).log_roots]

    async def lines(self, cursor: LogCursor, tail_lines: int, *, final: bool) -> list[str]:
        """Complete lines written since the last read (the last `tail_lines` of them on the first read).

        Read by byte offset, split on newlines only; an unfinished last line waits for its end unless
        the job has ended. At most MAX_LOG_BYTES_PER_POLL a poll; on the last poll, the rest is read too.
        """
        if not cursor.path:
            return []
        data, size = await self.read(cursor, tail_lines)
        lines = split_lines(cursor, data, final=final and cursor.offset >= size)
        if tail_lines:
            return lines[-tail_lines:]
        for _ in range(_FINAL_READS):  # the end of a finished job's log, however much came at the end
            if not (final and data and cursor.offset < size):
                break
            data, size = await self.read(cursor, 0)
            lines.extend(split_lines(cursor, data, final=cursor.offset >= size))
        return lines

    async def read(self, cursor: LogCursor, tail_lines: int) -> tuple[bytes, int]:
        """(bytes from the offset, or the file's last chunk on a first read with a tail; the file's size)."""
        if not cursor.host:
            return await asyncio.to_thread(_read_local, cursor, tail_lines, self.local_roots)
        chunk = await self.read_remote(
            cursor.host, cursor.path, self._hosts.require(cursor.host).log_roots, cursor.offset, tail=tail_lines > 0
        )
        if chunk.start < cursor.offset:  # truncated or rotated: start again from its beginning
            cursor.partial_line = ""
        cursor.offset = chunk.start + len(chunk.data)
        return chunk.data, chunk.size

    async def read_remote(self, host: str, path: str, roots: Sequence[str], offset: int, *, tail: bool) -> Chunk:
        """Up to MAX_LOG_BYTES_PER_POLL of a file on a host under `roots`, checked there as a log is (an empty
        chunk of size 0 when the file does not exist)."""
        result = await self._hosts.run(host, _remote_read(path, roots, offset, tail=tail))
        header, _, data = result.raw_stdout.partition(b"\n")
        verdict, *values = header.decode(errors="replace").split() or ["?"]
        if result.exit_status != 0 or verdict not in _REMOTE_VERDICTS or len(values) != _REMOTE_VERDICTS[verdict]:
            raise FailedPrecondition(
                f"unexpected output reading {path} on {host} (exit status {result.exit_status}): "
                f"{header[:200]!r} {result.stderr.strip()[:200]}",
                reason=ErrorReason.MALFORMED_OUTPUT,
            )
        if verdict == "missing":
            return Chunk(b"", 0, 0, exists=False)  # not written yet
        if verdict == "outside":
            raise _outside(path, host, roots, resolved=True)
        if verdict == "other":
            raise _not_regular(path, host, values[0])
        if verdict == "links":
            raise _linked(path, host, int(values[0]))
        return Chunk(data, int(values[0]), int(values[1]))


# The remote side of Logs.read, in POSIX sh with readlink -f (GNU coreutils, busybox): resolve the path and
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


def open_log(path: str, roots: Sequence[str], flags: int) -> int | None:
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


def _read_local(cursor: LogCursor, tail_lines: int, roots: Sequence[str]) -> tuple[bytes, int]:
    layout = relay_state(cursor.path, roots)  # read first: a relay writes it before it cuts the log
    descriptor = open_log(cursor.path, roots, os.O_RDONLY)
    if descriptor is None:
        return b"", 0
    try:
        with open(descriptor, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            if tail_lines:
                cursor.offset = max(size - MAX_LOG_BYTES_PER_POLL, 0)
                cursor.cuts_seen = layout.cut if layout else 0
            elif layout is not None and layout.cut != cursor.cuts_seen:
                _follow_cut(cursor, layout, size)
            if size < cursor.offset:  # truncated or replaced: from its beginning
                cursor.offset, cursor.partial_line, cursor.shift = 0, "", 0
            handle.seek(cursor.offset)
            data = handle.read(MAX_LOG_BYTES_PER_POLL)
    except OSError as error:
        raise FailedPrecondition(
            f"cannot read {cursor.path}: {error.strerror}", reason=ErrorReason.LOG_UNREADABLE
        ) from error
    cursor.offset += len(data)
    if layout is not None and 0 < layout.tail_at <= cursor.offset:  # in the tail: shifted by what was cut
        cursor.shift = layout.tail_from - layout.tail_at
    return data, size


def relay_state(path: str, roots: Sequence[str]) -> RelayState | None:
    """What the relay of a local job's log did (None without one, or when it cannot be read)."""
    try:
        descriptor = open_log(path + STATE_SUFFIX, roots, os.O_RDONLY)
    except FailedPrecondition:
        return None
    if descriptor is None:
        return None
    with open(descriptor, "rb") as handle:
        return parse_state(handle.read(STATE_BYTES))


def _follow_cut(cursor: LogCursor, layout: RelayState, size: int) -> None:
    """The relay cut the log since the cursor last read it: a reader in the head, which stays, reads on; one
    past it goes on in the kept tail, at the first output it has not read (at the tail's start if that was
    cut)."""
    if cursor.offset > layout.tail_from - layout.cut:  # past the head
        position = cursor.offset + cursor.shift  # in the job's whole output
        cursor.shift = layout.tail_from - layout.tail_at
        if position - cursor.shift < layout.tail_at:  # unread output was cut: its line is not whole
            cursor.partial_line = ""
        cursor.offset = min(max(layout.tail_at, position - cursor.shift), size)
    cursor.cuts_seen = layout.cut


def split_lines(cursor: LogCursor, data: bytes, *, final: bool) -> list[str]:
    lines = (cursor.partial_line + data.decode(errors="replace")).split("\n")
    cursor.partial_line = lines.pop()[-MAX_LINE_CHARS:]  # a line without end is kept, bounded
    if final and cursor.partial_line:
        lines.append(cursor.partial_line)
        cursor.partial_line = ""
    return lines
