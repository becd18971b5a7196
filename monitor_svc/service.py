"""Assembles the monitor process: NVML probe, SSH hosts, jobs (their records reloaded), workspaces, servicer, host."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc

from monitor_svc.gpus import GpuSampler, NvmlProbe
from monitor_svc.jobs import JobRecords, Jobs, LogLimits, SlurmLimits, Supervision
from monitor_svc.jobs.sandbox import SECRET_DIRECTORIES, Sandbox
from monitor_svc.servicer import MonitorServicer
from monitor_svc.ssh import SshHosts
from monitor_svc.workspaces.operations import Workspaces
from monitor_svc.workspaces.registry import WorkspaceRegistry
from quarry.config import CONFIG_FILE_ENV, MonitorSettings, QuarrySettings
from quarry.diagnostics import Check, Diagnostics, Fact, Finding, Status, setting_name
from quarry.identity import MeshRole
from quarry.mesh_auth import Access
from quarry.server import ServiceHost, ServiceRegistration, service_host
from quarry.v1 import monitor_pb2, monitor_pb2_grpc

SERVICE_NAME = monitor_pb2.DESCRIPTOR.services_by_name["MonitorService"].full_name
_EITHER = frozenset({MeshRole.SUPERVISOR, MeshRole.WORKER})
# SubmitJob is further refused unless the monitor's settings allow job submission.
ACCESS: Access = {
    "ListGpus": _EITHER,
    "WatchGpus": _EITHER,
    "SubmitJob": _EITHER,
    "WatchJob": _EITHER,
    # Workspaces: only under the configured workspace roots, which are empty by default.
    "OpenWorkspace": _EITHER,
    "GetWorkspace": _EITHER,
    "ListWorkspaceTree": _EITHER,
    "ReadWorkspaceFile": _EITHER,
    "SearchWorkspace": _EITHER,
    "WriteWorkspaceFile": _EITHER,
    "PatchWorkspace": _EITHER,
    "CreateWorkspaceBranch": _EITHER,
    "DiffWorkspace": _EITHER,
    "CommitWorkspace": _EITHER,
    "ResetWorkspace": _EITHER,
}


def sandbox_for(settings: MonitorSettings, common: QuarrySettings, jobs_dir: Path) -> Sandbox:
    """The sandbox local jobs run in, hiding what the monitor and its peers keep secret."""
    hidden = [
        str(common.data_dir),  # databases, job records, workspace registry, state file
        str(jobs_dir),
        *settings.log_roots,
        "~/.ssh",
        *SECRET_DIRECTORIES,
        os.environ.get(CONFIG_FILE_ENV, ""),
        common.tls_key_file,
        *(host.key_path for host in settings.hosts.values()),
        *settings.job_sandbox_hidden_paths,
    ]
    return Sandbox(settings.job_sandbox, settings.unsandboxed_jobs, [path for path in hidden if path])


def diagnostics(settings: MonitorSettings, probe: NvmlProbe, sandbox: Sandbox) -> Diagnostics:
    async def local_gpus() -> Finding:
        gpus, reason = await probe.sample()
        if not gpus:
            # A monitor may be there only for its SSH hosts or jobs: no local GPU is worth knowing, not a fault.
            return Finding(Status.WARNING, reason or "this host has no NVIDIA GPU")
        return Finding(Status.OK, f"{len(gpus)} GPU(s): {', '.join(sorted({gpu.name for gpu in gpus}))}")

    facts = [
        Fact("SSH hosts", ", ".join(sorted(settings.hosts)) or "none", setting_name(settings, "hosts")),
        Fact(
            "job submission",
            "allowed" if settings.allow_job_submission else "refused",
            setting_name(settings, "allow_job_submission"),
        ),
        Fact(
            "workspace roots",
            ", ".join(settings.workspace_roots) or "none",
            setting_name(settings, "workspace_roots"),
        ),
        Fact("local job sandbox", sandbox.describe(), setting_name(settings, "job_sandbox")),
    ]
    return Diagnostics("monitor", facts=facts, checks=[Check("local GPUs", local_gpus)])


async def build_host(settings: MonitorSettings | None = None, common: QuarrySettings | None = None) -> ServiceHost:
    settings = settings or MonitorSettings()
    common = common or QuarrySettings()
    probe = NvmlProbe()
    hosts = SshHosts(settings.hosts, command_timeout=settings.ssh_command_timeout)
    gpus = GpuSampler(probe, hosts)
    # The registry resolves a workspace_id to its host, root and protected paths (for jobs, too).
    registry = WorkspaceRegistry(common.data_dir / "monitor" / "workspaces")
    workspaces = Workspaces(
        registry,
        hosts,
        settings.workspace_roots,
        git_timeout=settings.workspace_git_timeout,
    )
    jobs_dir = Path(settings.jobs_dir) if settings.jobs_dir else common.data_dir / "jobs"
    sandbox = sandbox_for(settings, common, jobs_dir)
    await asyncio.to_thread(sandbox.probe)  # once: whether bwrap works here
    jobs = Jobs(
        hosts,
        gpus,
        jobs_dir,
        # Not among the log roots: a record is not a log anyone may tail.
        JobRecords(common.data_dir / "monitor" / "jobs"),
        SlurmLimits(settings.slurm_unknown_polls, settings.slurm_time_limit_buffer_seconds),
        settings.log_roots,
        workspaces=workspaces,
        sandbox=sandbox,
        allow_submission=settings.allow_job_submission,
        supervision=Supervision(settings.job_poll_seconds, settings.job_stop_grace_seconds),
        log_limits=LogLimits(settings.max_job_log_bytes, settings.job_log_disk_reserve_bytes),
    )
    await jobs.resume()

    def register(server: grpc.aio.Server) -> None:
        monitor_pb2_grpc.add_MonitorServiceServicer_to_server(MonitorServicer(gpus, hosts, jobs, workspaces), server)

    async def release() -> None:
        await jobs.close()
        await hosts.close()
        probe.close()

    return service_host(
        settings,
        common,
        ServiceRegistration(SERVICE_NAME, register),
        access=ACCESS,
        diagnostics=diagnostics(settings, probe, sandbox),
        on_stopped=[release],
    )
