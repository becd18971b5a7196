"""A database that is away or full: clear errors, one log line per outage, and health that says so."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import make_url

from quarry import outages, server
from quarry.db import Database
from quarry.errors import ErrorReason, Unavailable
from quarry.server import ServiceHost
from tests.conftest import POSTGRES_URL
from tests.fakes.tcp_proxy import TcpProxy

metadata = sa.MetaData()
notes = sa.Table(
    "outage_notes", metadata, sa.Column("note_id", sa.Integer, primary_key=True), sa.Column("text", sa.Text)
)


def _insert(note_id: int, text: str) -> Any:
    return lambda connection: connection.execute(notes.insert().values(note_id=note_id, text=text))


async def test_a_full_disk_is_named_with_the_file_and_is_a_health_problem_until_a_write_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The file is capped below; its filesystem is not full, so no free space would count as room again.
    monkeypatch.setattr(outages, "DISK_ROOM_BYTES", 1 << 62)
    path = tmp_path / "full.db"
    database = Database(f"sqlite:///{path}")
    max_pages = {"value": 1_000_000}

    # SQLite's own SQLITE_FULL ("database or disk is full"), on the real write path: the file may not grow
    # past this many pages, as if the disk had no room left.
    @sa.event.listens_for(database.engine, "begin")
    def _limit(connection: sa.Connection) -> None:
        connection.exec_driver_sql(f"PRAGMA max_page_count={max_pages['value']}")

    try:
        await database.write(lambda connection: metadata.create_all(connection))
        await database.write(_insert(1, "kept"))
        assert database.health_problem() is None
        max_pages["value"] = 1  # smaller than the file already is: nothing more fits
        with pytest.raises(Unavailable) as failed:
            await database.write(_insert(2, "x" * 100_000))
        assert failed.value.reason is ErrorReason.DATABASE_DISK_FULL
        assert str(path) in failed.value.message and "disk is full" in failed.value.message
        problem = database.health_problem()
        assert problem is not None and str(path) in problem and "disk space" in problem
        # Space again: the next write succeeds, the problem is gone, and nothing written before was lost.
        max_pages["value"] = 1_000_000
        await database.write(_insert(3, "after"))
        assert database.health_problem() is None
        rows = await database.read(lambda connection: connection.execute(sa.select(notes.c.text)).scalars().all())
        assert sorted(rows) == ["after", "kept"]
    finally:
        await database.close()


async def test_an_outage_is_logged_when_it_begins_and_when_it_ends_not_at_every_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with TcpProxy("127.0.0.1", 5432) as proxy:
        url = make_url(POSTGRES_URL).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        database = Database(url)
        try:
            await database.read(lambda connection: connection.execute(sa.text("SELECT 1")).all())
            caplog.set_level(logging.WARNING, logger="quarry.db")
            proxy.cut()
            for _ in range(5):
                with pytest.raises(Unavailable) as failed:
                    await database.read(lambda connection: connection.execute(sa.text("SELECT 1")).all())
                assert failed.value.reason is ErrorReason.DATABASE_UNAVAILABLE
            proxy.restore()
            await database.read(lambda connection: connection.execute(sa.text("SELECT 1")).all())
        finally:
            await database.close()
    lines = [record.getMessage() for record in caplog.records if record.name == "quarry.db"]
    assert len([line for line in lines if "is unavailable" in line]) == 1, lines
    assert len([line for line in lines if "answers again" in line]) == 1, lines
    assert f":{proxy.port}/" in lines[0], "the line says which database"


async def test_health_follows_the_hosts_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "HEALTH_CHECK_SECONDS", 0.05)
    problem: list[str] = []
    host = ServiceHost("127.0.0.1:0", [], health_checks=[lambda: problem[0] if problem else None])
    await host.start()
    try:
        async with grpc.aio.insecure_channel(host.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)

            async def status() -> int:
                response = await health.Check(health_pb2.HealthCheckRequest())
                return int(response.status)

            async def becomes(expected: int) -> None:
                for _ in range(200):
                    if await status() == expected:
                        return
                    await asyncio.sleep(0.02)
                raise AssertionError(f"health never became {expected}")

            assert await status() == health_pb2.HealthCheckResponse.SERVING
            problem.append("the disk is full")
            await becomes(health_pb2.HealthCheckResponse.NOT_SERVING)
            problem.clear()
            await becomes(health_pb2.HealthCheckResponse.SERVING)
    finally:
        await host.shutdown()
