"""A delegation left "running" by a worker that died is ended as failed once its lease expires."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from quarry.agent.messages import system, user
from quarry.clients.channels import insecure_channel
from quarry.config import QuarrySettings, WorkerSettings
from quarry.db import Database
from quarry.migrations import upgrade_schema
from quarry.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from quarry.vocabulary import Tier
from worker_svc.delegations import DelegationRequest
from worker_svc.schema import delegations
from worker_svc.service import MIGRATIONS, VERSION_TABLE
from worker_svc.service import build_host as build_worker
from worker_svc.store import DelegationStore


async def test_a_dead_workers_delegation_is_ended_as_failed(tmp_path: Path, database_url: str) -> None:
    await asyncio.to_thread(upgrade_schema, database_url, MIGRATIONS, VERSION_TABLE)
    database = Database(database_url)
    try:
        dead = DelegationStore(database, owner="worker-that-died")
        request = DelegationRequest("run-9:orphan", "run-9", "call-1", "thread-1", "An objective.")
        await dead.start(request, "conv-orphan", [system("rules"), user("task")], Tier.WORKER)
        old = datetime.now(UTC) - timedelta(hours=1)
        await database.write(
            lambda connection: connection.execute(
                delegations.update().where(delegations.c.delegation_id == "run-9:orphan").values(heartbeat_time=old)
            )
        )
    finally:
        await database.close()
    settings = WorkerSettings(address="127.0.0.1:0", database_url=database_url)
    host = await build_worker(settings, QuarrySettings(data_dir=tmp_path))
    async with host, insecure_channel(host.address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        for _ in range(100):  # the first sweep runs as the worker starts
            found = await stub.GetDelegation(worker_pb2.GetDelegationRequest(delegation_id="run-9:orphan"))
            if found.delegation.state != worker_pb2.DELEGATION_STATE_RUNNING:
                break
            await asyncio.sleep(0.05)
    delegation = found.delegation
    assert delegation.state == worker_pb2.DELEGATION_STATE_FAILED
    assert delegation.result.error.code == common_pb2.DELEGATION_ERROR_CODE_INTERNAL
    assert "stopped before it ended" in delegation.last_error and delegation.HasField("end_time")
