from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest

from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import QuarrySettings, ScratchpadSettings
from quarry.server import ServiceHost
from quarry.v1 import common_pb2, scratchpad_pb2, scratchpad_pb2_grpc
from scratchpad_svc.service import build_host
from tests.scratchpad_svc.processes import Processes

MAX_CONTENT_BYTES = 1024
MAX_SOURCES = 3
MAX_BATCH = 4


@pytest.fixture
async def scratchpad_host(database_url: str, tmp_path: Path) -> AsyncIterator[ServiceHost]:
    """The scratchpad in this process, on a free port, over the parametrised database."""
    settings = ScratchpadSettings(
        address="127.0.0.1:0",
        database_url=database_url,
        max_content_bytes=MAX_CONTENT_BYTES,
        max_sources=MAX_SOURCES,
        max_batch=MAX_BATCH,
        # No timer wake-ups: a Watch test passes only if commits really signal watchers.
        watch_poll_seconds=3600,
    )
    host = await build_host(settings, QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1))
    async with host:
        yield host


@pytest.fixture
async def channel(scratchpad_host: ServiceHost) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(scratchpad_host.address) as channel:
        yield channel


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> scratchpad_pb2_grpc.ScratchpadServiceStub:
    return scratchpad_pb2_grpc.ScratchpadServiceStub(channel)


@pytest.fixture
def client(channel: grpc.aio.Channel) -> ScratchpadClient:
    return ScratchpadClient(channel)


RESEARCHER = common_pb2.Principal(principal_id="worker-a", role=common_pb2.ROLE_RESEARCHER)
SUPERVISOR = common_pb2.Principal(principal_id="supervisor", role=common_pb2.ROLE_SUPERVISOR)


def finding(
    thread_id: str, request_id: str = "r-1", content: str = "a verified fact", **overrides: object
) -> scratchpad_pb2.AppendRequest:
    fields: dict[str, object] = {
        "thread_id": thread_id,
        "request_id": request_id,
        "kind": scratchpad_pb2.ENTRY_KIND_FINDING,
        "author": RESEARCHER,
        "content": content,
        "sources": [common_pb2.Source(url="https://example.org/a", title="A", excerpt="fact")],
    }
    fields.update(overrides)
    return scratchpad_pb2.AppendRequest(**fields)  # type: ignore[arg-type]


@pytest.fixture
def make_thread(stub: scratchpad_pb2_grpc.ScratchpadServiceStub) -> Callable[..., object]:
    async def create(thread_id: str = "") -> str:
        response = await stub.CreateThread(scratchpad_pb2.CreateThreadRequest(thread_id=thread_id, title="test"))
        return response.thread.thread_id

    return create


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    tracked = Processes(tmp_path)
    yield tracked
    tracked.close()
