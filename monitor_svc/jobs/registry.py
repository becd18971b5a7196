"""The executor of each kind of job. A new kind (Kubernetes Jobs, say) is a module with its executor, its
JobKind, and one line here."""

from __future__ import annotations

from pathlib import Path

from monitor_svc.jobs.executor import JobExecutor
from monitor_svc.jobs.local import LocalExecutor, LogLimits
from monitor_svc.jobs.sandbox import Sandbox
from monitor_svc.jobs.slurm import SlurmExecutor, SlurmLimits
from monitor_svc.jobs.spec import JobKind
from monitor_svc.jobs.ssh import SshExecutor
from monitor_svc.logs import Logs
from monitor_svc.ssh import SshHosts
from monitor_svc.workspaces.operations import Workspaces


def executors(
    hosts: SshHosts,
    logs: Logs,
    workspaces: Workspaces,
    jobs_dir: Path,
    slurm: SlurmLimits,
    sandbox: Sandbox,
    log_limits: LogLimits | None = None,
) -> dict[JobKind, JobExecutor]:
    every: list[JobExecutor] = [
        LocalExecutor(logs, workspaces, jobs_dir, sandbox, log_limits),
        SshExecutor(hosts, logs, workspaces),
        SlurmExecutor(hosts, logs, workspaces, slurm),
    ]
    return {executor.kind: executor for executor in every}
