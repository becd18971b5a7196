"""Files a job wrote, read once it has ended (its JSON-lines metrics): on this machine or on its host.

Each is checked as a log is (under the job's working directory, a regular file with one link), and
only its last MAX_JSONL_BYTES are read, from the first whole line.
"""

from __future__ import annotations

import os
import posixpath

from monitor_svc.logs import Logs, open_log

MAX_JSONL_BYTES = 64 * 1024 * 1024  # of a metrics file, its last part is read


def read_local_file(working_directory: str, relative: str) -> bytes | None:
    """A file under the working directory on this machine; None if it does not exist."""
    root = os.path.realpath(working_directory)
    descriptor = open_log(os.path.join(root, relative), [root], os.O_RDONLY)
    if descriptor is None:
        return None
    with open(descriptor, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        start = max(size - MAX_JSONL_BYTES, 0)
        handle.seek(start)
        return _whole_lines(handle.read(MAX_JSONL_BYTES), cut=start > 0)


async def read_remote_file(logs: Logs, host: str, working_directory: str, relative: str) -> bytes | None:
    """A file under the working directory on an SSH host; None if it does not exist."""
    path = posixpath.join(working_directory, relative)
    roots = [working_directory]
    chunk = await logs.read_remote(host, path, roots, 0, tail=False)
    if not chunk.exists:
        return None
    start = max(chunk.size - MAX_JSONL_BYTES, 0)
    if start:
        chunk = await logs.read_remote(host, path, roots, start, tail=False)
    parts = [chunk.data]
    while chunk.data and chunk.start + len(chunk.data) < chunk.size:
        chunk = await logs.read_remote(host, path, roots, chunk.start + len(chunk.data), tail=False)
        parts.append(chunk.data)
    return _whole_lines(b"".join(parts), cut=start > 0)


def _whole_lines(data: bytes, *, cut: bool) -> bytes:
    """Without the first line when the data starts mid-line."""
    return data.partition(b"\n")[2] if cut else data
