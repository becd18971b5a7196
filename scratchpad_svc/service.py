"""Assembles the scratchpad process: settings, schema upgrade, domain, servicer, host."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc

from quarry.config import QuarrySettings, ScratchpadSettings
from quarry.db import Database
from quarry.diagnostics import Diagnostics, database_diagnostics
from quarry.identity import MeshRole
from quarry.mesh_auth import Access
from quarry.migrations import open_migrated_database
from quarry.notify import PostgresCommitListener, listen_for_commits
from quarry.server import ServiceHost, ServiceRegistration, service_host
from quarry.v1 import scratchpad_pb2, scratchpad_pb2_grpc
from scratchpad_svc.feed import Payloads
from scratchpad_svc.scratchpad import Scratchpad
from scratchpad_svc.servicer import ScratchpadServicer
from scratchpad_svc.store import NOTIFY_CHANNEL, ScratchpadStore, notify_scope
from scratchpad_svc.validation import Limits

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_scratchpad"
SERVICE_NAME = scratchpad_pb2.DESCRIPTOR.services_by_name["ScratchpadService"].full_name
_EITHER = frozenset({MeshRole.SUPERVISOR, MeshRole.WORKER})
# Only the supervisor opens threads; both write to them, in the roles authority.py lets each act in.
ACCESS: Access = {
    "CreateThread": frozenset({MeshRole.SUPERVISOR}),
    "GetThread": _EITHER,
    "Append": _EITHER,
    "Read": _EITHER,
    "Watch": _EITHER,
}


async def open_scratchpad(
    database: Database, settings: ScratchpadSettings
) -> tuple[Scratchpad, PostgresCommitListener | None]:
    """The scratchpad over `database`, and on PostgreSQL the started listener that feeds it other replicas'
    commits (the caller stops it)."""
    payloads = Payloads(scope=await notify_scope(database), origin=uuid.uuid4().hex)
    scratchpad = Scratchpad(
        ScratchpadStore(database, payloads),
        Limits(max_content_bytes=settings.max_content_bytes, max_sources=settings.max_sources),
        max_batch=settings.max_batch,
        watch_poll_seconds=settings.watch_poll_seconds,
    )
    return scratchpad, listen_for_commits(database, NOTIFY_CHANNEL, scratchpad.feed)


async def build_host(settings: ScratchpadSettings | None = None, common: QuarrySettings | None = None) -> ServiceHost:
    """Upgrade the schema and return a ready-to-start host for the scratchpad."""
    settings = settings or ScratchpadSettings()
    common = common or QuarrySettings()
    # Its SQLite file is its own (replicas share PostgreSQL): appends commit on the event loop.
    database = await open_migrated_database(
        settings.resolved_database_url(common.data_dir), MIGRATIONS, VERSION_TABLE, inline_writes=True
    )
    scratchpad, listener = await open_scratchpad(database, settings)
    database_fact, database_check = database_diagnostics(settings, common, MIGRATIONS, VERSION_TABLE)

    def register(server: grpc.aio.Server) -> None:
        scratchpad_pb2_grpc.add_ScratchpadServiceServicer_to_server(ScratchpadServicer(scratchpad), server)

    async def release() -> None:
        if listener is not None:
            await listener.stop()
        await database.close()

    return service_host(
        settings,
        common,
        ServiceRegistration(SERVICE_NAME, register),
        access=ACCESS,
        diagnostics=Diagnostics("scratchpad", facts=[database_fact], checks=[database_check]),
        health_checks=[database.health_problem],
        on_drain=[scratchpad.close],
        on_stopped=[release],
    )
