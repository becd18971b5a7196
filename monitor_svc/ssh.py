"""Commands on configured hosts over SSH (asyncssh): one reused connection per host, host keys checked.

A host's key must be in its known_hosts file (by default ~/.ssh/known_hosts):
an unknown or changed key is refused with an error that says how to fix it,
never accepted silently. Connections are opened on first use, reopened after a
failure, and closed when the monitor stops.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from quarry.config import SshHost
from quarry.errors import FailedPrecondition, NotFound, Unavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str


def quote(*argv: str) -> str:
    return " ".join(shlex.quote(arg) for arg in argv)


class SshHosts:
    def __init__(self, hosts: dict[str, SshHost], *, command_timeout: float = 30.0) -> None:
        self._hosts = hosts
        self._timeout = command_timeout
        self._connections: dict[str, asyncssh.SSHClientConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {name: asyncio.Lock() for name in hosts}

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
            connection = self._connections.get(name)
            if connection is not None and not connection.is_closed():
                return connection
            known_hosts = host.known_hosts or str(Path.home() / ".ssh" / "known_hosts")
            try:
                connection = await asyncio.wait_for(
                    asyncssh.connect(
                        host.address,
                        port=host.port,
                        username=host.user,
                        client_keys=[host.key_path] if host.key_path else (),
                        known_hosts=known_hosts,
                        agent_path=None,
                        config=None,
                    ),
                    self._timeout,
                )
            except asyncssh.HostKeyNotVerifiable as error:
                raise FailedPrecondition(
                    f"the host key of {name} ({host.address}:{host.port}) is not in {known_hosts}: {error.reason}. "
                    f"Check it and add it (e.g. ssh-keyscan -p {host.port} {host.address} >> {known_hosts})",
                    reason="HOST_KEY_UNKNOWN",
                    metadata={"host": name},
                ) from error
            except asyncssh.PermissionDenied as error:
                raise FailedPrecondition(
                    f"{host.user}@{name} refused our key ({host.key_path or 'none configured'}): {error.reason}",
                    reason="SSH_AUTH_FAILED",
                    metadata={"host": name},
                ) from error
            except (OSError, asyncssh.Error, TimeoutError) as error:
                raise Unavailable(f"cannot reach {name} ({host.address}:{host.port}): {error}") from error
            self._connections[name] = connection
            return connection

    async def run(self, name: str, command: str) -> CommandResult:
        """Run a shell command on the host; its exit status is returned, not raised."""
        connection = await self._connection(name)
        try:
            result = await asyncio.wait_for(connection.run(command, check=False), self._timeout)
        except TimeoutError as error:
            raise Unavailable(f"{command.split()[0]} on {name} did not finish within {self._timeout:g} s") from error
        except (OSError, asyncssh.Error) as error:
            self._connections.pop(name, None)  # reopened on the next command
            raise Unavailable(f"the connection to {name} failed: {error}") from error
        return CommandResult(
            exit_status=result.exit_status if result.exit_status is not None else -1,
            stdout=str(result.stdout or ""),
            stderr=str(result.stderr or ""),
        )

    async def close(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()
        for connection in connections:
            await connection.wait_closed()
