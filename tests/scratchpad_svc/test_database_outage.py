"""When PostgreSQL drops our connections, calls fail as UNAVAILABLE (retryable) and then recover."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
import psycopg
import pytest
from sqlalchemy.engine import make_url

from quarry.clients.scratchpad import ScratchpadClient
from quarry.v1 import scratchpad_pb2, scratchpad_pb2_grpc
from tests.conftest import POSTGRES_URL
from tests.scratchpad_svc.conftest import RESEARCHER, finding


def terminate_pool_connections(database_url: str) -> int:
    """Kill this test's own pooled connections (found by application_name), not the LISTEN one."""
    application_name = make_url(database_url).query["application_name"]
    conninfo = make_url(POSTGRES_URL).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s AND query NOT ILIKE %s",
            (application_name, "%LISTEN%"),
        ).fetchall()
    return len(rows)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_dropped_connections_are_unavailable_then_recover(
    database_url: str,
    stub: scratchpad_pb2_grpc.ScratchpadServiceStub,
    client: ScratchpadClient,
    make_thread: Callable[[], Awaitable[str]],
) -> None:
    thread_id = await make_thread()
    await stub.Append(finding(thread_id, "before"))
    # A read leaves a connection in the pool (on PostgreSQL the append runs on a connection of its own).
    await stub.GetThread(scratchpad_pb2.GetThreadRequest(thread_id=thread_id))
    assert terminate_pool_connections(database_url) > 0
    codes = []
    for _ in range(10):  # each pooled connection fails once, then the pool is rebuilt
        try:
            await stub.GetThread(scratchpad_pb2.GetThreadRequest(thread_id=thread_id))
            break
        except grpc.aio.AioRpcError as error:
            codes.append(error.code())
    assert codes and set(codes) == {grpc.StatusCode.UNAVAILABLE}
    # The product client retries UNAVAILABLE, and the append lands exactly once.
    terminate_pool_connections(database_url)
    response = await client.append(
        thread_id, request_id="after", kind=scratchpad_pb2.ENTRY_KIND_FINDING, author=RESEARCHER, content="after"
    )
    assert response.entry.sequence_no == 2
    # The read connection killed beside the append's fails the first read; the client retries it.
    assert [entry.request_id for entry in await client.read_all(thread_id)] == ["before", "after"]
