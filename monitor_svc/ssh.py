"""Commands on configured hosts over SSH (asyncssh): one reused connection per host, host keys checked.

A host's key must be in its known_hosts file (by default ~/.ssh/known_hosts):
an unknown or changed key is refused with an error that says how to fix it,
never accepted silently. Connections are opened on first use, reopened after a
failure, and closed when the monitor stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from quarry.config import SshHost
from quarry.errors import ErrorReason, FailedPrecondition, NotFound, Unavailable

log = logging.getLogger(__name__)

_SESSIONS = 8  # plus one SFTP session, below OpenSSH's MaxSessions of 10
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str  # decoded, undecodable bytes replaced
    stderr: str
    raw_stdout: bytes  # as sent: byte offsets into remote files count these
    truncated: bool = False  # stdout was longer than the caller's limit: cut there, the command closed


def _as_bytes(output: bytes | str | None) -> bytes:
    """What a process without an encoding sent (asyncssh types it loosely)."""
    return output.encode() if isinstance(output, str) else output or b""


def quote(*argv: str) -> str:
    return " ".join(shlex.quote(arg) for arg in argv)


async def _bounded(stream: asyncssh.SSHReader[bytes], limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of the stream, and whether there was more."""
    data = bytearray()
    while chunk := _as_bytes(await stream.read(_CHUNK)):
        data.extend(chunk)
        if len(data) > limit:
            return bytes(data[:limit]), True
    return bytes(data), False


async def _drained(stream: asyncssh.SSHReader[bytes], limit: int) -> bytes:
    """The stream's first `limit` bytes, the rest read and dropped (so the command never blocks writing)."""
    data = bytearray()
    while chunk := _as_bytes(await stream.read(_CHUNK)):
        data.extend(chunk[: max(limit - len(data), 0)])
    return bytes(data)


async def _collect(
    process: asyncssh.SSHClientProcess[bytes], max_stdout: int | None
) -> tuple[int | None, bytes, bytes, bool]:
    """(exit status, stdout, stderr, truncated): all of it, or stdout up to `max_stdout` (then closed)."""
    if max_stdout is None:
        result = await process.wait(check=False)
        return result.exit_status, _as_bytes(result.stdout), _as_bytes(result.stderr), False
    errors = asyncio.ensure_future(_drained(process.stderr, _CHUNK))
    try:
        stdout, truncated = await _bounded(process.stdout, max_stdout)
        if truncated:
            process.close()
            return None, stdout, b"", True
        result = await process.wait(check=False)
        return result.exit_status, stdout, await errors, False
    finally:
        errors.cancel()


class SshHosts:
    def __init__(self, hosts: dict[str, SshHost], *, command_timeout: float = 30.0) -> None:
        self._hosts = hosts
        self._timeout = command_timeout
        self._connections: dict[str, asyncssh.SSHClientConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {name: asyncio.Lock() for name in hosts}
        # Below OpenSSH's default MaxSessions (10): commands beyond it wait instead of failing.
        self._sessions: dict[str, asyncio.Semaphore] = {name: asyncio.Semaphore(_SESSIONS) for name in hosts}
        self._sftp: dict[str, tuple[asyncssh.SSHClientConnection, asyncssh.SFTPClient]] = {}
        self._sftp_locks: dict[str, asyncio.Lock] = {name: asyncio.Lock() for name in hosts}
        self._closed = False

    @property
    def names(self) -> list[str]:
        return sorted(self._hosts)

    def require(self, name: str, field: str = "host") -> SshHost:
        """The configured host of that name (NOT_FOUND names the field that named it)."""
        host = self._hosts.get(name)
        if host is None:
            raise NotFound("host", name, field=field)
        return host

    async def _connection(self, name: str) -> asyncssh.SSHClientConnection:
        host = self.require(name)
        async with self._locks[name]:
            if self._closed:
                raise Unavailable("the monitor is shutting down")
            connection = self._connections.get(name)
            if connection is not None and not connection.is_closed():
                return connection
            connection = await self._connect(name, host)
            self._connections[name] = connection
            return connection

    async def _connect(self, name: str, host: SshHost) -> asyncssh.SSHClientConnection:
        known_hosts = host.known_hosts or str(Path.home() / ".ssh" / "known_hosts")
        for path, what in ((known_hosts, "known_hosts file"), (host.key_path, "key file")):
            if path and not await asyncio.to_thread(os.path.isfile, path):
                raise FailedPrecondition(
                    f"the {what} for {name} does not exist: {path}", reason=ErrorReason.SSH_CONFIG_INVALID
                )
        try:
            return await asyncio.wait_for(
                asyncssh.connect(
                    host.address,
                    port=host.port,
                    username=host.user,
                    # None: no key at all, as configured (an empty tuple would load ~/.ssh's defaults).
                    client_keys=[host.key_path] if host.key_path else None,
                    known_hosts=known_hosts,
                    agent_path=None,
                    config=None,
                    keepalive_interval=15,
                    keepalive_count_max=3,
                ),
                self._timeout,
            )
        except asyncssh.HostKeyNotVerifiable as error:
            raise FailedPrecondition(
                f"the host key of {name} ({host.address}:{host.port}) is not in {known_hosts}: {error.reason}. "
                f"Check it and add it (e.g. ssh-keyscan -p {host.port} {host.address} >> {known_hosts})",
                reason=ErrorReason.HOST_KEY_UNKNOWN,
                metadata={"host": name},
            ) from error
        except asyncssh.PermissionDenied as error:
            raise FailedPrecondition(
                f"{host.user}@{name} refused our key ({host.key_path or 'none configured'}): {error.reason}",
                reason=ErrorReason.SSH_AUTH_FAILED,
                metadata={"host": name},
            ) from error
        except (asyncssh.KeyImportError, ValueError) as error:  # e.g. an encrypted or unreadable key
            raise FailedPrecondition(
                f"the key for {name} cannot be used: {error}", reason=ErrorReason.SSH_CONFIG_INVALID
            ) from error
        except (OSError, asyncssh.Error, TimeoutError) as error:
            raise Unavailable(f"cannot reach {name} ({host.address}:{host.port}): {error}") from error

    async def connect(self, name: str) -> None:
        """Open the host's connection now (Unavailable, FailedPrecondition when it cannot be)."""
        await self._connection(name)

    def _drop(self, name: str, connection: asyncssh.SSHClientConnection) -> None:
        """Forget a failed connection (only that one: another caller may have opened a new one) and close it."""
        if self._connections.get(name) is connection:
            del self._connections[name]
        connection.close()

    async def run(
        self, name: str, command: str, *, time_limit: float | None = None, max_stdout: int | None = None
    ) -> CommandResult:
        """Run a shell command on the host; its exit status is returned, not raised.

        `time_limit` replaces the configured command timeout; with `max_stdout`, output beyond it is not
        read: the command is closed and the result says it was truncated (its exit status is then -1).
        """
        limit = self._timeout if time_limit is None else time_limit
        connection = await self._connection(name)
        async with self._sessions[name]:
            try:
                async with connection.create_process(command, stdin=asyncssh.DEVNULL, encoding=None) as process:
                    try:
                        status, raw, errors, truncated = await asyncio.wait_for(_collect(process, max_stdout), limit)
                    except TimeoutError as error:
                        process.close()  # the remote command must not keep a session open
                        self._drop(name, connection)  # a hung command may mean a half-open connection
                        raise Unavailable(
                            f"{command.split()[0]} on {name} did not finish within {limit:g} s"
                        ) from error
            except (OSError, asyncssh.Error) as error:
                self._drop(name, connection)  # reopened on the next command
                raise Unavailable(f"the connection to {name} failed: {error}") from error
        return CommandResult(
            exit_status=status if status is not None else -1,
            stdout=raw.decode(errors="replace"),
            stderr=errors.decode(errors="replace"),
            raw_stdout=raw,
            truncated=truncated,
        )

    @contextlib.asynccontextmanager
    async def sftp(self, name: str) -> AsyncIterator[asyncssh.SFTPClient]:
        """The host's SFTP session (one per connection, opened on first use) for a few calls, bounded by
        the command timeout. A file's own error (missing, refused) is the caller's to handle; a failure of
        the session or the connection drops the connection (reopened on next use) and is UNAVAILABLE."""
        connection = await self._connection(name)
        async with self._sftp_locks[name]:
            known = self._sftp.get(name)
            if known is not None and known[0] is connection:
                client = known[1]
            else:
                try:
                    client = await asyncio.wait_for(connection.start_sftp_client(), self._timeout)
                except (OSError, asyncssh.Error, TimeoutError) as error:
                    self._drop(name, connection)
                    raise Unavailable(f"cannot open an SFTP session on {name}: {error}") from error
                self._sftp[name] = (connection, client)
        try:
            async with asyncio.timeout(self._timeout):
                yield client
        except (asyncssh.SFTPConnectionLost, asyncssh.SFTPNoConnection) as error:
            self._drop(name, connection)
            raise Unavailable(f"the SFTP session on {name} failed: {error}") from error
        except asyncssh.SFTPError:
            raise
        except (OSError, asyncssh.Error, TimeoutError) as error:
            self._drop(name, connection)
            raise Unavailable(f"the SFTP session on {name} failed: {error}") from error

    async def close(self) -> None:
        self._closed = True
        for lock in self._locks.values():  # a connect in progress finishes first, and is closed below
            async with lock:
                pass
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()
        for connection in connections:
            await connection.wait_closed()
