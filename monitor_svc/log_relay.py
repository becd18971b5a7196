"""A local job's log writer: its output from a pipe into its log, capped, and the job stopped before the disk fills.

The monitor runs it as `python -I log_relay.py ...` (standard library only, so no PYTHONPATH of the job's
can break it), in a session of its own beside the job, which stays the monitor's child so that its exit
status is its own. It outlives a monitor restart and ends when the job's last writer closes the pipe.

The log never grows past --max-bytes: when a write would pass it, the middle is cut in place: the first
quarter (the head) stays, then a marker line saying how many bytes were cut, then the newest quarter (the
tail, from a line's start), and appending goes on; a log is rewritten once per half a cap written.
Every few MiB, and on ENOSPC, it looks at the free space of the log's file system; below
--reserve-bytes it kills the job's process group. What it did is kept in the state file beside the log
(STATE_SUFFIX; written in place, so that even a full disk does not stop it): where the tail begins, how
many bytes were cut, and why the job was stopped. The monitor reads it (monitor_svc/logs.py).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import signal
import sys
from dataclasses import dataclass

STATE_SUFFIX = ".relay"
STATE_BYTES = 4096  # the state file's fixed size, allocated once
_READ_BYTES = 1 << 20
_CHECK_EVERY_BYTES = 4 << 20
_ALIGN_BYTES = 64 * 1024  # the tail starts after the first newline this close to its start
MIN_MAX_BYTES = 64 * 1024  # a cap this small still leaves room for the marker between head and tail


@dataclass(frozen=True)
class RelayState:
    tail_at: int = 0  # where the kept tail begins in the file (after the marker); 0 before any cut
    tail_from: int = 0  # where it begins in the job's whole output
    cut: int = 0  # bytes of output cut in all
    stopped: str = ""  # why the relay stopped the job, if it did


def parse_state(data: bytes) -> RelayState | None:
    """The state file's content; None when it is not one (a job may have written over it)."""
    try:
        fields = json.loads(data.strip(b" \x00") or b"null")
        if not isinstance(fields, dict):
            return None
        tail_at, tail_from, cut = (fields.get(name, 0) for name in ("tail_at", "tail_from", "cut"))
        stopped = fields.get("stopped", "")
        if any(type(number) is not int for number in (tail_at, tail_from, cut)) or not isinstance(stopped, str):
            return None
        return RelayState(tail_at, tail_from, cut, stopped[:1000])
    except (ValueError, RecursionError):
        return None


def marker(cut: int, cap: int) -> bytes:
    return f"\n[quarry: {cut} bytes of this job's output were cut here; its log is kept under {cap} bytes]\n".encode()


def disk_full(free: int, reserve: int) -> str:
    return f"stopped: the disk holding its log is full ({free} bytes free, reserve {reserve})"


def unwritable(error: OSError) -> str:
    return f"stopped: its log could not be written ({error.strerror or error})"


class Relay:
    def __init__(self, log: int, state: int, cap: int, reserve: int, pgid: int) -> None:
        self._log, self._state, self._cap, self._reserve, self._pgid = log, state, cap, reserve, pgid
        self._size = os.lseek(log, 0, os.SEEK_END)  # an existing log is appended to
        self._head = self._tail = cap // 4
        self._marker = 0  # the length of the marker in the file; 0 before any cut
        self._unchecked = _CHECK_EVERY_BYTES  # look at the disk before the first write
        self.state = RelayState()
        self._save()

    def run(self, source: int) -> None:
        while chunk := os.read(source, _READ_BYTES):
            if self.state.stopped:
                continue  # read and dropped until the killed job's pipe closes
            self._unchecked += len(chunk)
            if self._unchecked >= _CHECK_EVERY_BYTES:
                self._unchecked = 0
                if self._free() < self._reserve:
                    self._stop(disk_full(self._free(), self._reserve))
                    continue
            try:
                self._write(chunk)
            except OSError as error:  # the job's output would go nowhere: it is stopped, and says why
                full = error.errno in (errno.ENOSPC, errno.EDQUOT)
                self._stop(disk_full(self._free(), self._reserve) if full else unwritable(error))

    def _free(self) -> int:
        info = os.fstatvfs(self._log)
        return info.f_bavail * info.f_frsize

    def _stop(self, reason: str) -> None:
        self.state = RelayState(self.state.tail_at, self.state.tail_from, self.state.cut, reason)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._pgid, signal.SIGKILL)
        self._save()

    def _save(self) -> None:
        state = self.state
        text = json.dumps(
            {"tail_at": state.tail_at, "tail_from": state.tail_from, "cut": state.cut, "stopped": state.stopped}
        )
        os.pwrite(self._state, text.encode().ljust(STATE_BYTES), 0)  # in place: needs no new block

    def _write(self, chunk: bytes) -> None:
        room = self._head - self._size
        if self._size + len(chunk) > self._cap and room > 0:  # the head is filled first
            self._append(chunk[:room])
            chunk = chunk[room:]
        if self._size + len(chunk) > self._cap:
            self._cut(chunk)
        else:
            self._append(chunk)

    def _append(self, data: bytes) -> None:
        _pwrite_all(self._log, data, self._size)
        self._size += len(data)

    def _cut(self, chunk: bytes) -> None:
        """Head, marker, then the newest output: the tail copied forward in the file, then this chunk."""
        head = self._head
        after_head = self._size - head - self._marker  # output since the head (the old marker is not output)
        keep = min(self._tail, after_head + len(chunk))
        from_file = max(keep - len(chunk), 0)
        source = self._size - from_file
        kept_chunk = chunk[len(chunk) - (keep - from_file) :]
        start = os.pread(self._log, min(from_file, _ALIGN_BYTES), source) if from_file else kept_chunk[:_ALIGN_BYTES]
        skip = start.find(b"\n") + 1  # a tail from a line's start (0: none begins near enough)
        if from_file:
            source, from_file = source + skip, from_file - skip
        else:
            kept_chunk = kept_chunk[skip:]
        cut = self.state.cut + after_head + len(chunk) - from_file - len(kept_chunk)
        text = marker(cut, self._cap)
        tail_at = head + len(text)
        self.state = RelayState(tail_at, head + cut, cut, self.state.stopped)
        self._save()  # first: a reader that sees the file shrink finds where its tail begins
        _pwrite_all(self._log, text, head)
        destination = tail_at
        while from_file > 0:  # forward: the destination is always before the source
            data = os.pread(self._log, min(from_file, _READ_BYTES), source)
            if not data:
                break
            _pwrite_all(self._log, data, destination)
            source, destination, from_file = source + len(data), destination + len(data), from_file - len(data)
        _pwrite_all(self._log, kept_chunk, destination)
        self._size = destination + len(kept_chunk)
        self._marker = len(text)
        os.ftruncate(self._log, self._size)


def _pwrite_all(descriptor: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(descriptor, view, offset)
        view, offset = view[written:], offset + written


def main(arguments: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a job's output (stdin) to its log, capped.")
    parser.add_argument("--log-fd", type=int, required=True, help="the log, open for reading and writing")
    parser.add_argument("--state-fd", type=int, required=True, help="the state file beside it, open for writing")
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--reserve-bytes", type=int, required=True)
    parser.add_argument("--pgid", type=int, required=True, help="the job's process group, killed on a full disk")
    options = parser.parse_args(arguments)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # fewer, larger reads of a job that writes fast
        fcntl.fcntl(sys.stdin.fileno(), fcntl.F_SETPIPE_SZ, _READ_BYTES)
    relay = Relay(
        options.log_fd, options.state_fd, max(options.max_bytes, MIN_MAX_BYTES), options.reserve_bytes, options.pgid
    )
    relay.run(sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
