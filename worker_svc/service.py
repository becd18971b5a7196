"""Assembles the worker process: settings, schema upgrade, model, tools, worker, servicer, host."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import grpc
import httpx

from quarry.agent.conversation import ConversationStore
from quarry.agent.model import ModelClient, ModelSettings
from quarry.clients.channels import Dialer
from quarry.clients.monitor import MonitorClient
from quarry.clients.scratchpad import ScratchpadClient
from quarry.compute import ComputeView
from quarry.config import ModelTier, QuarrySettings, SupervisorSettings, WorkerSettings
from quarry.identity import MeshRole, Principal
from quarry.mesh_auth import Access
from quarry.migrations import open_migrated_database
from quarry.recording import Recordings, RecordingStore, RecordingTransport
from quarry.replay.qrun import WORKER_ANSWER_SETTINGS, replayed_settings
from quarry.research_plane import ResearchPlane
from quarry.server import ServiceHost, ServiceRegistration, service_host
from quarry.v1 import worker_pb2, worker_pb2_grpc
from quarry.vocabulary import Tier
from quarry.workspace import WorkspaceView
from worker_svc.corpus import Corpus, Embedder, EmbeddingSettings, RerankedSearch
from worker_svc.corpus.fusion import Fusion
from worker_svc.delegations import DelegationRequest
from worker_svc.diagnostics import diagnostics
from worker_svc.roles import ROLES
from worker_svc.servicer import WorkerServicer
from worker_svc.store import DelegationStore
from worker_svc.tools import DelegationContext
from worker_svc.web.fetch import AddressPolicy, guarded_client
from worker_svc.web.pages import PageReader
from worker_svc.web.papers import LiteratureSkills
from worker_svc.web.search import SearchBackend, http_backend, literature_catalogues
from worker_svc.worker import Worker, WorkerLimits
from worker_svc.workspace_tools import WorkspaceSession

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_worker"
SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name
# Delegations spend model tokens on the supervisor's behalf: only it may start or look at them.
ACCESS: Access = {
    "Delegate": frozenset({MeshRole.SUPERVISOR}),
    "GetDelegation": frozenset({MeshRole.SUPERVISOR}),
    "ExportRecording": frozenset({MeshRole.SUPERVISOR}),
}


def default_worker_id() -> str:
    """The id of a worker configured without one: its host (a pod's name under Kubernetes) and a random
    suffix, so that two workers on one host differ."""
    return f"{socket.gethostname()[:57]}-{secrets.token_hex(3)}"  # at most 64 characters, as the column


async def build_host(
    settings: WorkerSettings | None = None,
    common: QuarrySettings | None = None,
    supervisor_tier: ModelTier | None = None,
) -> ServiceHost:
    """`supervisor_tier` is the model the supervisor tier's roles run on: by default the supervisor's own
    (QUARRY_SUPERVISOR_MODEL_*), each setting it leaves unset falling back to this worker's model."""
    settings = settings or WorkerSettings()
    common = common or QuarrySettings()
    supervisor_tier = supervisor_tier or SupervisorSettings()
    dial = Dialer.from_settings(common)
    database = await open_migrated_database(settings.resolved_database_url(common.data_dir), MIGRATIONS, VERSION_TABLE)
    models = {
        Tier.WORKER: ModelClient(ModelSettings.for_tier(settings, common)),
        Tier.SUPERVISOR: ModelClient(ModelSettings.for_tier(supervisor_tier, common, fallback=settings)),
    }
    channel = dial.channel(settings.scratchpad_address)
    scratchpad = ResearchPlane(ScratchpadClient(channel))
    monitor_channel = dial.channel(settings.monitor_address) if settings.monitor_address else None
    monitor_client = MonitorClient(monitor_channel) if monitor_channel else None
    monitor = ComputeView(monitor_client) if monitor_client else None
    embedding = EmbeddingSettings.for_worker(settings, common)
    embedder = None if embedding is None else Embedder(embedding)
    index = Path(settings.corpus_index) if settings.corpus_index else common.data_dir / "corpus.db"
    corpus = Corpus(index, embedder, Fusion.of(settings))
    search_http = httpx.AsyncClient(
        timeout=settings.search_seconds, transport=RecordingTransport(httpx.AsyncHTTPTransport())
    )
    policy = AddressPolicy(allow=tuple(entry.strip() for entry in settings.fetch_allow.split(",") if entry.strip()))
    web = guarded_client(policy)
    # One page cache for the process: pages are public, what each delegation read is tracked per context.
    pages = PageReader(
        web,
        corpus=corpus,
        chunk_chars=settings.page_chunk_chars,
        fetch_seconds=settings.page_fetch_seconds,
        extract_seconds=settings.page_extract_seconds,
        extract_memory_bytes=settings.page_extract_memory_mb * 2**20,
        extract_workers=settings.page_extract_workers,
    )
    search: SearchBackend = http_backend(settings, search_http) or corpus
    literature = literature_catalogues(settings, search_http)
    papers = LiteratureSkills.of(settings, search_http)
    if embedder is not None and search is not corpus and settings.embedding_rerank_web:
        search = RerankedSearch(search, embedder)

    def context_for(request: DelegationRequest) -> DelegationContext:
        assert request.role is not None
        workspace = None
        if ROLES[request.role].works_in_workspace and monitor_client is not None and monitor is not None:
            # Bound here, before the model sees anything: its tools reach this workspace only.
            view = WorkspaceView(monitor_client, request.workspace_id)
            workspace = WorkspaceSession(view, monitor, settings.engineer_command_seconds)
        return DelegationContext(
            scratchpad=scratchpad,
            scratchpad_thread_id=request.scratchpad_thread_id,
            author=Principal(request.delegation_id, request.role),
            search=search,
            pages=pages,
            literature=literature,
            papers=papers,
            monitor=monitor,
            workspace=workspace,
        )

    worker_id = settings.id or default_worker_id()
    worker = Worker(
        models=models,
        conversations=ConversationStore(database),
        delegations=DelegationStore(database, worker_id=worker_id),
        context_for=context_for,
        # The id it goes by, made or configured, so that a replay's worker goes by the same.
        recordings=Recordings(
            RecordingStore(database), {**replayed_settings(settings, WORKER_ANSWER_SETTINGS), "id": worker_id}
        ),
        limits=WorkerLimits(
            max_concurrent=settings.max_concurrent_delegations,
            default_timeout_seconds=settings.default_timeout_seconds,
            context_tokens=settings.context_tokens,
            compute=monitor is not None,
            lease_seconds=settings.lease_seconds,
        ),
    )

    await worker.start()

    def register(server: grpc.aio.Server) -> None:
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(worker), server)

    async def release() -> None:
        pages.close()
        for model in models.values():
            await model.close()
        await web.aclose()
        await search_http.aclose()
        if embedder is not None:
            embedder.close()
        await channel.close(None)
        if monitor_channel is not None:
            await monitor_channel.close(None)
        await database.close()

    return service_host(
        settings,
        common,
        ServiceRegistration(SERVICE_NAME, register),
        access=ACCESS,
        diagnostics=diagnostics(
            settings,
            common,
            supervisor_tier=supervisor_tier,
            corpus=corpus,
            search=search,
            dial=dial,
            migrations=MIGRATIONS,
            version_table=VERSION_TABLE,
        ),
        health_checks=[database.health_problem],
        # Running delegations get most of the grace period to finish; the rest end cancelled, recorded.
        on_drain=[lambda: worker.close(finish_within=common.shutdown_grace_seconds * 0.8)],
        on_stopped=[release],
    )
