"""Workspaces on a configured SSH host: files over the host's SFTP session, git as a quoted argument vector.

Paths are resolved here, component by component over SFTP's lstat and readlink (the algorithm of
Python's realpath), rather than by the SFTP server's realpath, whose handling of missing components
differs between servers.
"""

from __future__ import annotations

import contextlib
import posixpath
import shlex
import stat
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import asyncssh

from monitor_svc.ssh import SshHosts
from monitor_svc.workspaces.backend import MAX_GIT_STDERR, cannot, info_of, not_a_file
from monitor_svc.workspaces.paths import realpath
from monitor_svc.workspaces.types import FileInfo, GitOutput

_T = TypeVar("_T")
_CREATE = asyncssh.FXF_WRITE | asyncssh.FXF_CREAT | asyncssh.FXF_EXCL


class SshBackend:
    def __init__(self, hosts: SshHosts, name: str, git_timeout: float) -> None:
        self._hosts = hosts
        self._name = name
        self._git_timeout = git_timeout

    @property
    def host(self) -> str:
        return self._name

    async def _call(self, verb: str, path: str, call: Callable[[asyncssh.SFTPClient], Awaitable[_T]]) -> _T:
        async with self._hosts.sftp(self._name) as client:
            try:
                return await call(client)
            except asyncssh.SFTPError as error:
                raise cannot(verb, path, self._name, error.reason) from error

    async def lstat(self, path: str) -> FileInfo | None:
        async def lstat(client: asyncssh.SFTPClient) -> FileInfo | None:
            try:
                attrs = await client.lstat(path)
            except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPNoSuchPath, asyncssh.SFTPNotADirectory):
                return None
            return info_of(attrs.permissions or 0, attrs.size or 0)

        return await self._call("inspect", path, lstat)

    async def _lstat_mode(self, path: str) -> int | None:
        async def mode(client: asyncssh.SFTPClient) -> int | None:
            try:
                return (await client.lstat(path)).permissions
            except asyncssh.SFTPError:  # as Python's realpath treats any lstat error: not a link
                return None

        return await self._call("inspect", path, mode)

    async def _readlink(self, path: str) -> str:
        async def readlink(client: asyncssh.SFTPClient) -> str:
            return str(await client.readlink(path))

        return await self._call("read the link", path, readlink)

    async def realpath(self, path: str) -> str:
        return await realpath(path, self._lstat_mode, self._readlink)

    async def listdir(self, path: str) -> list[tuple[str, FileInfo]]:
        async def listdir(client: asyncssh.SFTPClient) -> list[tuple[str, FileInfo]]:
            names = await client.readdir(path)  # lstat-like attributes: links are not followed
            return [
                (str(name.filename), info_of(name.attrs.permissions or 0, name.attrs.size or 0))
                for name in names
                if name.filename not in (".", "..")
            ]

        return await self._call("list", path, listdir)

    async def read(self, path: str, limit: int) -> tuple[bytes, int]:
        async def read(client: asyncssh.SFTPClient) -> tuple[bytes, int]:
            async with client.open(path, "rb", encoding=None) as handle:
                attrs = await handle.stat()
                if not stat.S_ISREG(attrs.permissions or 0):
                    raise not_a_file(path, "not a regular file")
                data = await handle.read(limit)
                return (data if isinstance(data, bytes) else data.encode()), attrs.size or 0

        return await self._call("read", path, read)

    async def write(self, path: str, data: bytes, mode: int | None) -> None:
        directory, name = posixpath.split(path)
        temporary = posixpath.join(directory, f".{name}.quarry-{uuid.uuid4().hex[:12]}.tmp")

        async def write(client: asyncssh.SFTPClient) -> None:
            attrs = asyncssh.SFTPAttrs(permissions=0o666 if mode is None else mode)
            try:
                async with client.open(temporary, _CREATE, attrs, encoding=None) as handle:
                    await handle.write(data)
                    with contextlib.suppress(asyncssh.SFTPOpUnsupported):  # fsync@openssh.com where offered
                        await handle.fsync()
                if mode is not None:
                    await client.chmod(temporary, mode)  # the old file's mode, whatever the host's umask
                await client.posix_rename(temporary, path)
            except BaseException:
                with contextlib.suppress(asyncssh.SFTPError):
                    await client.remove(temporary)
                raise

        await self._call("write", path, write)

    async def makedirs(self, path: str) -> None:
        async def makedirs(client: asyncssh.SFTPClient) -> None:
            await client.makedirs(path, exist_ok=True)

        await self._call("create the directory", path, makedirs)

    async def remove(self, path: str) -> None:
        async def remove(client: asyncssh.SFTPClient) -> None:
            with contextlib.suppress(asyncssh.SFTPNoSuchFile):
                await client.remove(path)

        await self._call("delete", path, remove)

    async def git(self, args: Sequence[str], env: Mapping[str, str], *, max_output: int) -> GitOutput:
        # The host's shell parses this line: every word is quoted, so it is exactly this vector.
        command = shlex.join(["env", *(f"{name}={value}" for name, value in env.items()), "git", *args])
        result = await self._hosts.run(self._name, command, time_limit=self._git_timeout, max_stdout=max_output)
        stderr = result.stderr[:MAX_GIT_STDERR]
        return GitOutput(result.exit_status, result.raw_stdout, stderr, result.truncated)
