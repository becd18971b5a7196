"""An HTTP/1.1 server on 127.0.0.1 that replays raw response bytes, for tests of the model client's stream reading.

Raw asyncio rather than aiohttp, so that what goes on the wire is exactly the fixture: each answer is a body
written in parts (one HTTP chunk each, `pause` seconds apart), or `Drop`: read the request, then close the
socket without a byte of response, as a restarting server or a load balancer's idle reset does. Connections
are kept alive between requests (unless an answer closes its own after it), and counted as they open and close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.loopback import Served


@dataclass(frozen=True)
class Answer:
    parts: tuple[bytes, ...]
    # Seconds between parts.
    pause: float = 0.0
    content_type: str = "text/event-stream"
    # Close the connection once the answer is sent, without saying so (no `connection: close`): a server
    # whose keep-alive timeout ran out on an idle connection.
    close: bool = False


@dataclass(frozen=True)
class Drop:
    """Read the request, then close the connection without answering."""


@dataclass
class ReplayServer(Served):
    answers: deque[Answer | Drop] = field(default_factory=deque)
    requests: list[dict[str, Any]] = field(default_factory=list)
    # TCP connections accepted, and those since closed (by either side).
    connections: int = 0
    closed: int = 0
    base_url: str = ""
    _server: asyncio.Server | None = None
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)

    def script(self, *answers: Answer | Drop) -> None:
        self.answers.extend(answers)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for handler in self._handlers:
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while await self._exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: the cases under test include it
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self.closed += 1

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is done."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(json.loads(body))
        answer = self.answers.popleft() if self.answers else Answer((b'{"error": {"message": "no more answers"}}',))
        if isinstance(answer, Drop):
            return False
        writer.write(
            f"HTTP/1.1 200 OK\r\ncontent-type: {answer.content_type}\r\ntransfer-encoding: chunked\r\n\r\n".encode()
        )
        for index, part in enumerate(answer.parts):
            if index and answer.pause:
                await asyncio.sleep(answer.pause)
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return not answer.close
