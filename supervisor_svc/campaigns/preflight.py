"""Whether a campaign can run, asked of the monitor before the campaign is accepted: a campaign the monitor cannot
serve is refused at once, with the setting to change, never accepted and then paused.

The checks: the monitor answers; it runs jobs (its diagnostics say so); and it opens the workspace, which
means the root is under a workspace root it allows, is an existing directory and is the top of a git working
tree (opening is idempotent: the campaign's loop opens the same workspace again).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import grpc

from quarry.errors import ErrorReason, FailedPrecondition, ServiceError, Unavailable
from quarry.v1 import diagnostics_pb2, diagnostics_pb2_grpc
from supervisor_svc.campaigns.ports import LabOpener
from supervisor_svc.campaigns.spec import CampaignSpec

Preflight = Callable[[CampaignSpec], Awaitable[None]]

# Seconds the monitor's diagnostics may take; a monitor slower than that is not refused for it.
DIAGNOSTICS_SECONDS = 10.0

# What to change when the monitor refuses the workspace, by the reason it gives.
_WORKSPACE_FIXES = {
    ErrorReason.WORKSPACE_ROOT_NOT_ALLOWED: (
        "choose a root under one, or add a directory above it to QUARRY_MONITOR_WORKSPACE_ROOTS (or the SSH "
        "host's workspace_roots) where the monitor runs"
    ),
    ErrorReason.WORKSPACE_ROOT_INVALID: "give --root (workspace.root) as an existing directory",
    ErrorReason.WORKSPACE_NOT_A_REPO: "make it a git repository (`git init`, then commit the code)",
    ErrorReason.HOST_NOT_FOUND: "name a host QUARRY_MONITOR_HOSTS configures, or none for the monitor's machine",
}


def monitor_preflight(channel: grpc.aio.Channel, open_lab: LabOpener, monitor_address: str) -> Preflight:
    diagnostics = diagnostics_pb2_grpc.DiagnosticsServiceStub(channel)

    async def check(spec: CampaignSpec) -> None:
        where = f"the monitor at {monitor_address}"
        try:
            response = await diagnostics.GetDiagnostics(
                diagnostics_pb2.GetDiagnosticsRequest(), timeout=DIAGNOSTICS_SECONDS
            )
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.UNAVAILABLE:
                raise Unavailable(
                    f"{where} does not answer, so no campaign can run: start it (quarry up starts one), or set "
                    "QUARRY_SUPERVISOR_MONITOR_ADDRESS to where it runs"
                ) from None
            response = None  # slow, or refused to this caller: the workspace check below still asks it
        facts = {fact.name: fact.value for fact in response.facts} if response is not None else {}
        if facts.get("job submission") == "refused":
            raise FailedPrecondition(
                f"{where} does not run jobs, so the campaign could never run its experiment: set "
                "QUARRY_MONITOR_ALLOW_JOB_SUBMISSION=true where the monitor runs",
                reason=ErrorReason.JOB_SUBMISSION_DISABLED,
            )
        try:
            _, git = await open_lab(
                spec.workspace.root,
                host=spec.workspace.host,
                protected_paths=spec.brief.protected_paths,
                request_id=f"preflight/{uuid.uuid4()}",
            )
        except ServiceError as error:
            if error.code is grpc.StatusCode.UNAVAILABLE:
                raise Unavailable(f"{where} does not answer: {error.message}") from None
            fix = _WORKSPACE_FIXES.get(error.reason)
            said = f"{error.message}: {fix}" if fix else f"{where} refused the workspace: {error.message}"
            raise FailedPrecondition(said, reason=error.reason) from None
        if not git.is_repo or not git.head_commit:
            what = "is not the top of a git working tree" if not git.is_repo else "has no commit yet"
            raise FailedPrecondition(
                f"{spec.workspace.root} {what}: {_WORKSPACE_FIXES[ErrorReason.WORKSPACE_NOT_A_REPO]}",
                reason=ErrorReason.WORKSPACE_NOT_A_REPO,
            )

    return check
