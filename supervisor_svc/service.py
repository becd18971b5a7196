"""Assembles the supervisor process: settings, schema upgrade, model, clients, supervisor, servicer, host."""

from __future__ import annotations

from pathlib import Path

import grpc

from quarry.agent.conversation import ConversationStore
from quarry.agent.model import ModelClient, ModelSettings
from quarry.clients.channels import Dialer
from quarry.clients.monitor import MonitorClient
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import QuarrySettings, SupervisorSettings
from quarry.diagnostics import Diagnostics, Fact, database_diagnostics, model_diagnostics, peer_check, setting_name
from quarry.migrations import open_migrated_database
from quarry.notify import CommitSignal, listen_for_commits
from quarry.recording import Recordings, RecordingStore
from quarry.replay.qrun import SUPERVISOR_ANSWER_SETTINGS, replayed_settings
from quarry.research_plane import ResearchPlane
from quarry.server import ServiceHost, ServiceRegistration, service_host
from quarry.v1 import campaign_pb2, campaign_pb2_grpc, supervisor_pb2, supervisor_pb2_grpc
from supervisor_svc.access.guard import CAMPAIGN_ACCESS, SUPERVISOR_ACCESS, api_guard
from supervisor_svc.access.keys import active_keys
from supervisor_svc.campaigns.loop import LoopDependencies, LoopSettings, loop_factory
from supervisor_svc.campaigns.ports import monitor_lab
from supervisor_svc.campaigns.preflight import monitor_preflight
from supervisor_svc.campaigns.report import CampaignReports, Reports
from supervisor_svc.campaigns.service import MAX_ACTIVE_CAMPAIGNS, CampaignLoopFactory, Campaigns
from supervisor_svc.campaigns.servicer import CampaignServicer
from supervisor_svc.campaigns.store import CAMPAIGN_EVENTS_CHANNEL, CampaignStore
from supervisor_svc.campaigns.think import ThinkSettings
from supervisor_svc.hosting.host import HostLimits
from supervisor_svc.runs.run import RunDependencies
from supervisor_svc.runs.service import Supervisor
from supervisor_svc.runs.servicer import SupervisorServicer
from supervisor_svc.runs.store import RUN_EVENTS_CHANNEL, RunStore
from supervisor_svc.runs.worker_client import DelegationClient

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_supervisor"
SERVICE_NAME = supervisor_pb2.DESCRIPTOR.services_by_name["SupervisorService"].full_name
CAMPAIGN_SERVICE = campaign_pb2.DESCRIPTOR.services_by_name["CampaignService"].full_name


def diagnostics(settings: SupervisorSettings, common: QuarrySettings, dial: Dialer) -> Diagnostics:
    model_facts, model_check = model_diagnostics(settings, common)
    database_fact, database_check = database_diagnostics(settings, common, MIGRATIONS, VERSION_TABLE)
    scratchpad, workers = setting_name(settings, "scratchpad_address"), setting_name(settings, "worker_addresses")
    facts = [
        *model_facts,
        Fact("scratchpad", settings.scratchpad_address, scratchpad),
        Fact("workers", ", ".join(settings.worker_targets()), workers),
        Fact(
            "monitor (campaigns)",
            settings.monitor_address or "none: campaigns cannot start here",
            setting_name(settings, "monitor_address"),
        ),
        database_fact,
        Fact(
            "client authentication",
            "none: the public API is open" if settings.open_api else "API keys, roles checked",
            setting_name(settings, "open_api"),
        ),
    ]
    checks = [
        model_check,
        peer_check("scratchpad", settings.scratchpad_address, dial, scratchpad),
        *(peer_check("worker", target, dial, workers) for target in settings.worker_targets()),
        *(
            [peer_check("monitor", settings.monitor_address, dial, setting_name(settings, "monitor_address"))]
            if settings.monitor_address
            else []
        ),
        database_check,
    ]
    return Diagnostics("supervisor", facts=facts, checks=checks)


async def build_host(
    settings: SupervisorSettings | None = None,
    common: QuarrySettings | None = None,
    *,
    campaign_loop: CampaignLoopFactory | None = None,
) -> ServiceHost:
    """The supervisor's host: SupervisorService and CampaignService on one port.

    `campaign_loop` makes the loop that drives each campaign; by default the real loop (supervisor_svc.
    campaigns.loop) over the configured monitor. Without a monitor, StartCampaign answers UNIMPLEMENTED
    (the other campaign calls still work, and another replica may drive the campaigns).
    """
    settings = settings or SupervisorSettings()
    common = common or QuarrySettings()
    dial = Dialer.from_settings(common)
    # Before the database opens, so that a refused configuration leaves nothing open; the stored keys are
    # read only once calls come in.
    guard = api_guard(
        settings,
        common,
        {SERVICE_NAME: SUPERVISOR_ACCESS, CAMPAIGN_SERVICE: CAMPAIGN_ACCESS},
        lambda: database.read(active_keys),
    )
    database = await open_migrated_database(settings.resolved_database_url(common.data_dir), MIGRATIONS, VERSION_TABLE)
    model = ModelClient(ModelSettings.for_tier(settings, common))
    channel = dial.channel(settings.scratchpad_address)
    delegations = DelegationClient(settings.worker_targets(), dial)
    signal = CommitSignal()
    listener = listen_for_commits(database, RUN_EVENTS_CHANNEL, signal)
    supervisor = Supervisor(
        RunStore(database),
        RunDependencies(
            model=model,
            conversations=ConversationStore(database),
            scratchpad=ResearchPlane(ScratchpadClient(channel)),
            delegations=delegations,
            default_timeout_seconds=settings.default_run_timeout_seconds,
            default_parallel=settings.max_parallel_delegations,
            context_tokens=settings.context_tokens,
            verify_by_default=settings.verify_runs,
            verification_reserve=settings.verification_reserve,
            paper_hosts=settings.paper_host_names(),
            approval_wait_seconds=settings.approval_wait_seconds,
            database_wait_seconds=settings.database_wait_seconds,
            recordings=Recordings(RecordingStore(database), replayed_settings(settings, SUPERVISOR_ANSWER_SETTINGS)),
        ),
        HostLimits(
            max_active=settings.max_active_runs,
            lease_seconds=settings.run_lease_seconds,
            stream_poll_seconds=settings.stream_poll_seconds,
        ),
        signal,
        allow_self_approval=settings.allow_self_approval,
    )
    monitor_channel = dial.channel(settings.monitor_address) if settings.monitor_address else None
    preflight = None
    if campaign_loop is None and monitor_channel is not None:
        monitor_client = MonitorClient(monitor_channel)
        preflight = monitor_preflight(monitor_channel, monitor_lab(monitor_client), settings.monitor_address)
        campaign_loop = loop_factory(
            LoopDependencies(
                model=model,
                conversations=ConversationStore(database),
                scratchpad=ResearchPlane(ScratchpadClient(channel)),
                delegations=delegations,
                monitor=monitor_client,
                settings=LoopSettings(think=ThinkSettings(parallel_delegations=settings.max_parallel_delegations)),
            )
        )
    campaign_signal = CommitSignal()
    campaign_listener = listen_for_commits(database, CAMPAIGN_EVENTS_CHANNEL, campaign_signal)
    campaigns = Campaigns(
        CampaignStore(database),
        campaign_loop,
        HostLimits(
            max_active=MAX_ACTIVE_CAMPAIGNS,
            lease_seconds=settings.run_lease_seconds,
            stream_poll_seconds=settings.stream_poll_seconds,
        ),
        campaign_signal,
        preflight,
    )
    # The writer's reports, of any campaign in the store (the loop writes one at the end through its own).
    reports = CampaignReports(campaigns, Reports(ResearchPlane(ScratchpadClient(channel)), delegations))

    def register(server: grpc.aio.Server) -> None:
        supervisor_pb2_grpc.add_SupervisorServiceServicer_to_server(SupervisorServicer(supervisor), server)

    def register_campaigns(server: grpc.aio.Server) -> None:
        campaign_pb2_grpc.add_CampaignServiceServicer_to_server(CampaignServicer(campaigns, reports), server)

    async def release() -> None:
        for commits in (listener, campaign_listener):
            if commits is not None:
                await commits.stop()
        await model.close()
        await delegations.close()
        await channel.close(None)
        if monitor_channel is not None:
            await monitor_channel.close(None)
        await database.close()

    host = service_host(
        settings,
        common,
        ServiceRegistration(SERVICE_NAME, register),
        also=[ServiceRegistration(CAMPAIGN_SERVICE, register_campaigns)],
        api=guard,
        diagnostics=diagnostics(settings, common, dial),
        health_checks=[database.health_problem],
        # Campaign loops and runs only stop (their state is durable) and give up their leases, so another
        # replica or the restarted supervisor takes them up at once; a run already ending records its end
        # within most of the grace period; the rest is for the lease keepers to stop.
        on_drain=[
            lambda: campaigns.close(end_within=common.shutdown_grace_seconds * 0.2),
            reports.close,
            lambda: supervisor.close(end_within=common.shutdown_grace_seconds * 0.8),
        ],
        on_stopped=[release],
    )
    await supervisor.start()
    await campaigns.start()
    return host
