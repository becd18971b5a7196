"""Checks and placement every kind of submission shares: its options, what makes a retry the same, its workspace."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace

from monitor_svc.jobs.spec import Command, JobKind, JobOptions, JobRequest
from monitor_svc.metrics import CompiledMetric, compile_metrics
from monitor_svc.validation import check_environment, check_gpu_request, command_argv, refuse_nul, wall_clock_limit
from monitor_svc.workspaces.operations import Workspaces
from monitor_svc.workspaces.types import LOCAL, WorkspaceRecord
from quarry.errors import FieldViolation, InvalidArgument


def checked_command(
    request: JobRequest, options: JobOptions, request_id: str, kind: JobKind
) -> tuple[Command, tuple[str, ...]]:
    """A command's program and arguments, and its text checked for NUL (fields named under `kind`)."""
    if not isinstance(request, Command):
        raise TypeError(f"a {kind} job runs a command")
    argv = command_argv(request.argv, request.command_line, kind)
    refuse_nul(
        {
            f"{kind}.host": request.host,
            f"{kind}.working_directory": request.working_directory,
            f"{kind}.log_path": request.log_path,
            "request_id": request_id,
            "options.workspace_id": options.workspace_id,
        }
    )
    return request, argv


def checked_options(options: JobOptions, working_directory: str) -> tuple[CompiledMetric, ...]:
    """The options' faults as field violations; the metrics compiled."""
    check_environment(options.environment)
    wall_clock_limit(options.wall_clock_limit)
    check_gpu_request(options.gpus)
    if options.gpus.wanted and "CUDA_VISIBLE_DEVICES" in options.environment:
        raise InvalidArgument(
            [FieldViolation("options.environment", "CUDA_VISIBLE_DEVICES is set by the monitor for a GPU request")]
        )
    return compile_metrics(options.metrics, working_directory=working_directory)


def options_payload(options: JobOptions) -> dict[str, object]:
    """What of the options makes a submission another one (the environment's values included)."""
    return {
        "environment": dict(options.environment),
        "wall_clock_limit": options.wall_clock_limit,
        "gpus": asdict(options.gpus),
        "metrics": [asdict(spec) for spec in options.metrics],
        # Only when set: the digests of records written before workspaces stay valid.
        **({"workspace_id": options.workspace_id} if options.workspace_id else {}),
        **({"isolate_network": True} if options.isolate_network else {}),
    }


def gpu_environment(gpus: Sequence[int]) -> dict[str, str]:
    if not gpus:
        return {}
    # NVML numbers GPUs by PCI bus; CUDA's default order is another, unless told.
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


async def in_workspace(workspaces: Workspaces, command: Command, options: JobOptions, kind: JobKind) -> Command:
    """The command placed in its workspace: on the workspace's host, in its root or a directory inside it."""
    return (await in_workspace_root(workspaces, command, options, kind))[0]


async def in_workspace_root(
    workspaces: Workspaces, command: Command, options: JobOptions, kind: JobKind
) -> tuple[Command, WorkspaceRecord]:
    """The command placed in its workspace, and the workspace's record (its root, its protected paths)."""
    record, directory = await workspaces.job_path(
        options.workspace_id, command.working_directory, f"{kind}.working_directory", directory=True
    )
    return replace(command, host=workspace_host(record, command.host, kind), working_directory=directory), record


def workspace_host(record: WorkspaceRecord, named: str, kind: JobKind) -> str:
    """The host a job in the workspace runs on ("" for this machine): the workspace's, which a request that
    names a host must name."""
    host = "" if record.host == LOCAL else record.host
    if kind is JobKind.LOCAL and host:
        where = f"the workspace is on {host}: submit a remote command or a Slurm script there"
        raise InvalidArgument([FieldViolation("options.workspace_id", where)])
    if kind is not JobKind.LOCAL and not host:
        raise InvalidArgument(
            [FieldViolation("options.workspace_id", "the workspace is on this machine: submit a local command")]
        )
    if named and named != host:
        raise InvalidArgument(
            [FieldViolation(f"{kind}.host", f"the workspace is on {host}: name it, or leave this empty")]
        )
    return host
