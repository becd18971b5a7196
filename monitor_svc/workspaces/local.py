"""Workspaces on this machine: file calls in a worker thread, git as a child process with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import stat
import uuid
from collections.abc import Mapping, Sequence

from monitor_svc.workspaces.backend import MAX_GIT_STDERR, cannot, info_of, not_a_file
from monitor_svc.workspaces.types import LOCAL, FileInfo, GitOutput
from quarry.errors import Unavailable

_CHUNK = 64 * 1024


def _lstat(path: str) -> FileInfo | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError as error:
        raise cannot("inspect", path, LOCAL, error.strerror or str(error)) from error
    return info_of(info.st_mode, info.st_size)


def _listdir(path: str) -> list[tuple[str, FileInfo]]:
    try:
        with os.scandir(path) as entries:
            found = []
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):  # removed while listed
                    info = entry.stat(follow_symlinks=False)
                    found.append((entry.name, info_of(info.st_mode, info.st_size)))
            return found
    except OSError as error:
        raise cannot("list", path, LOCAL, error.strerror or str(error)) from error


def _read(path: str, limit: int) -> tuple[bytes, int]:
    # O_NOFOLLOW: a symbolic link swapped in since the path was checked is not followed; O_NONBLOCK:
    # nor does a FIFO swapped in block the thread (it is refused below).
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise not_a_file(path, "a symbolic link") from error
        raise cannot("read", path, LOCAL, error.strerror or str(error)) from error
    with open(descriptor, "rb") as handle:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise not_a_file(path, "not a regular file")
        os.set_blocking(descriptor, True)
        return handle.read(limit), info.st_size


def _write(path: str, data: bytes, mode: int | None) -> None:
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.quarry-{uuid.uuid4().hex[:12]}.tmp")
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        descriptor = os.open(temporary, flags, 0o666 if mode is None else mode)
    except OSError as error:
        raise cannot("write", path, LOCAL, error.strerror or str(error)) from error
    try:
        with open(descriptor, "wb") as handle:
            handle.write(data)
            if mode is not None:
                os.fchmod(handle.fileno(), mode)  # the old file's mode, whatever the umask
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise cannot("write", path, LOCAL, error.strerror or str(error)) from error


def _makedirs(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise cannot("create the directory", path, LOCAL, error.strerror or str(error)) from error


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise cannot("delete", path, LOCAL, error.strerror or str(error)) from error


async def _bounded(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of the stream, and whether there was more (then the rest is not read)."""
    data = bytearray()
    while chunk := await stream.read(_CHUNK):
        data.extend(chunk)
        if len(data) > limit:
            return bytes(data[:limit]), True
    return bytes(data), False


async def _drained(stream: asyncio.StreamReader, limit: int) -> bytes:
    """The stream's first `limit` bytes, the rest read and dropped (so the writer never blocks)."""
    data = bytearray()
    while chunk := await stream.read(_CHUNK):
        data.extend(chunk[: max(limit - len(data), 0)])
    return bytes(data)


class LocalBackend:
    def __init__(self, git_timeout: float) -> None:
        self._git_timeout = git_timeout

    @property
    def host(self) -> str:
        return LOCAL

    async def lstat(self, path: str) -> FileInfo | None:
        return await asyncio.to_thread(_lstat, path)

    async def realpath(self, path: str) -> str:
        return await asyncio.to_thread(os.path.realpath, path)

    async def listdir(self, path: str) -> list[tuple[str, FileInfo]]:
        return await asyncio.to_thread(_listdir, path)

    async def read(self, path: str, limit: int) -> tuple[bytes, int]:
        return await asyncio.to_thread(_read, path, limit)

    async def write(self, path: str, data: bytes, mode: int | None) -> None:
        await asyncio.to_thread(_write, path, data, mode)

    async def makedirs(self, path: str) -> None:
        await asyncio.to_thread(_makedirs, path)

    async def remove(self, path: str) -> None:
        await asyncio.to_thread(_remove, path)

    async def git(self, args: Sequence[str], env: Mapping[str, str], *, max_output: int) -> GitOutput:
        # Nothing of the monitor's environment but PATH: not its GIT_* variables (a GIT_DIR would steer it),
        # nor its settings and credentials.
        environment = {"PATH": os.environ.get("PATH", os.defpath)}
        try:
            process = await asyncio.create_subprocess_exec(
                "git",
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**environment, **env},
                start_new_session=True,  # its own process group, killed whole on timeout
            )
        except FileNotFoundError:
            return GitOutput(127, b"", "git: command not found")
        assert process.stdout is not None and process.stderr is not None
        try:
            async with asyncio.timeout(self._git_timeout):
                errors = asyncio.ensure_future(_drained(process.stderr, MAX_GIT_STDERR))
                try:
                    stdout, truncated = await _bounded(process.stdout, max_output)
                    if truncated:
                        _kill(process)
                    status = await process.wait()
                    stderr = await errors
                finally:
                    errors.cancel()
        except TimeoutError as error:
            raise Unavailable(f"git did not finish within {self._git_timeout:g} s") from error
        finally:
            if process.returncode is None:
                _kill(process)
                await process.wait()
        return GitOutput(status, stdout, stderr.decode(errors="replace"), truncated)


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
