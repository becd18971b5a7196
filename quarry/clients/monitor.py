"""The monitor's client: GPUs, jobs and workspaces."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message

from quarry.clients.retry import RetryPolicy
from quarry.v1 import monitor_pb2, monitor_pb2_grpc

__all__ = ["MonitorClient"]

# Seconds a workspace call may take beyond the attempt timeout: the monitor bounds its own work (a call
# may run several git or SSH commands, each within its timeout, or a search's child process).
_WORKSPACE_SECONDS = 120.0


class MonitorClient:
    """GPUs, jobs and workspaces, as the monitor sees them; no model is involved.

    Workspace changes carry a request_id (a fresh one unless given), so a retry after UNAVAILABLE or
    a deadline is answered with the first result instead of applying a patch or a commit twice.
    """

    def __init__(self, channel: grpc.aio.Channel, retry: RetryPolicy | None = None) -> None:
        self._stub = monitor_pb2_grpc.MonitorServiceStub(channel)
        # Short: a tool call should not wait half a minute for a monitor that is not there.
        self._retry = retry or RetryPolicy(total_seconds=5.0, attempt_timeout=5.0)

    async def list_gpus(self, host: str = "") -> monitor_pb2.ListGpusResponse:
        response: monitor_pb2.ListGpusResponse = await self._retry.call(
            self._stub.ListGpus, monitor_pb2.ListGpusRequest(host=host)
        )
        return response

    async def job_status(self, job: monitor_pb2.JobRef, *, log_tail_lines: int = 20) -> monitor_pb2.JobStatus:
        """One look at a job: the first answer of WatchJob, which then is closed."""
        stream: Any = self._stub.WatchJob(
            monitor_pb2.WatchJobRequest(job=job, log_tail_lines=log_tail_lines), timeout=self._retry.attempt_timeout * 3
        )
        try:
            async for response in stream:
                status: monitor_pb2.JobStatus = response.status
                return status
        finally:
            stream.cancel()
        raise RuntimeError("the monitor ended the watch without a status")

    async def submit_job(self, request: monitor_pb2.SubmitJobRequest) -> monitor_pb2.SubmitJobResponse:
        """Start a job; retried safely, as the monitor answers a repeated request_id with the job it started."""
        if not request.request_id:
            request.request_id = str(uuid.uuid4())
        # Starting may connect to an SSH host and choose GPUs: as long as a workspace call.
        response: monitor_pb2.SubmitJobResponse = await self._retry.call(
            self._stub.SubmitJob, request, extra_timeout=_WORKSPACE_SECONDS
        )
        return response

    async def watch_job(
        self, job: monitor_pb2.JobRef, *, deadline_seconds: float, log_tail_lines: int = 20, poll_seconds: int = 2
    ) -> AsyncGenerator[monitor_pb2.WatchJobResponse]:
        """WatchJob's responses until the job ends (a job the monitor started is reported as it changes) or
        `deadline_seconds` pass (DEADLINE_EXCEEDED)."""
        request = monitor_pb2.WatchJobRequest(
            job=job, log_tail_lines=log_tail_lines, poll_interval=duration_pb2.Duration(seconds=poll_seconds)
        )
        stream: Any = self._stub.WatchJob(request, timeout=deadline_seconds)
        try:
            async for response in stream:
                yield response
        finally:
            stream.cancel()

    # -- workspaces -------------------------------------------------------------------------------------

    async def _workspace_call(self, method: Callable[..., Any], request: Message) -> Any:
        return await self._retry.call(method, request, extra_timeout=_WORKSPACE_SECONDS)

    async def open_workspace(
        self, root: str, *, host: str = "", protected_paths: Sequence[str] = (), request_id: str = ""
    ) -> monitor_pb2.Workspace:
        """Open (or find again: the id depends only on host and root) a directory under a workspace root."""
        request = monitor_pb2.OpenWorkspaceRequest(
            host=host, root=root, protected_paths=protected_paths, request_id=request_id or str(uuid.uuid4())
        )
        response: monitor_pb2.OpenWorkspaceResponse = await self._workspace_call(self._stub.OpenWorkspace, request)
        return response.workspace

    async def get_workspace(self, workspace_id: str) -> monitor_pb2.Workspace:
        """The workspace and its current git state (HEAD, branch, dirty)."""
        request = monitor_pb2.GetWorkspaceRequest(workspace_id=workspace_id)
        response: monitor_pb2.GetWorkspaceResponse = await self._workspace_call(self._stub.GetWorkspace, request)
        return response.workspace

    async def list_workspace_tree(
        self, workspace_id: str, path: str = "", *, max_depth: int = 0, max_entries: int = 0
    ) -> monitor_pb2.ListWorkspaceTreeResponse:
        request = monitor_pb2.ListWorkspaceTreeRequest(
            workspace_id=workspace_id, path=path, max_depth=max_depth, max_entries=max_entries
        )
        response: monitor_pb2.ListWorkspaceTreeResponse = await self._workspace_call(
            self._stub.ListWorkspaceTree, request
        )
        return response

    async def read_workspace_file(
        self, workspace_id: str, path: str, *, start_line: int = 0, end_line: int = 0, max_bytes: int = 0
    ) -> monitor_pb2.ReadWorkspaceFileResponse:
        request = monitor_pb2.ReadWorkspaceFileRequest(
            workspace_id=workspace_id, path=path, start_line=start_line, end_line=end_line, max_bytes=max_bytes
        )
        response: monitor_pb2.ReadWorkspaceFileResponse = await self._workspace_call(
            self._stub.ReadWorkspaceFile, request
        )
        return response

    async def search_workspace(
        self,
        workspace_id: str,
        pattern: str,
        *,
        path: str = "",
        glob: str = "",
        case_insensitive: bool = False,
        max_matches: int = 0,
    ) -> monitor_pb2.SearchWorkspaceResponse:
        request = monitor_pb2.SearchWorkspaceRequest(
            workspace_id=workspace_id,
            pattern=pattern,
            path=path,
            glob=glob,
            case_insensitive=case_insensitive,
            max_matches=max_matches,
        )
        response: monitor_pb2.SearchWorkspaceResponse = await self._workspace_call(self._stub.SearchWorkspace, request)
        return response

    async def write_workspace_file(
        self, workspace_id: str, path: str, content: str, *, request_id: str = ""
    ) -> monitor_pb2.WriteWorkspaceFileResponse:
        request = monitor_pb2.WriteWorkspaceFileRequest(
            workspace_id=workspace_id, path=path, content=content, request_id=request_id or str(uuid.uuid4())
        )
        response: monitor_pb2.WriteWorkspaceFileResponse = await self._workspace_call(
            self._stub.WriteWorkspaceFile, request
        )
        return response

    async def patch_workspace(
        self, workspace_id: str, patch: str, *, request_id: str = ""
    ) -> monitor_pb2.PatchWorkspaceResponse:
        """Apply a unified diff to every file it names or to none (FAILED_PRECONDITION names the hunk)."""
        request = monitor_pb2.PatchWorkspaceRequest(
            workspace_id=workspace_id, patch=patch, request_id=request_id or str(uuid.uuid4())
        )
        response: monitor_pb2.PatchWorkspaceResponse = await self._workspace_call(self._stub.PatchWorkspace, request)
        return response

    async def create_workspace_branch(
        self, workspace_id: str, branch: str, *, start_point: str = "", request_id: str = ""
    ) -> monitor_pb2.Workspace:
        request = monitor_pb2.CreateWorkspaceBranchRequest(
            workspace_id=workspace_id,
            branch=branch,
            start_point=start_point,
            request_id=request_id or str(uuid.uuid4()),
        )
        response: monitor_pb2.CreateWorkspaceBranchResponse = await self._workspace_call(
            self._stub.CreateWorkspaceBranch, request
        )
        return response.workspace

    async def diff_workspace(
        self, workspace_id: str, *, base: str = "", target: str = "", max_bytes: int = 0
    ) -> monitor_pb2.DiffWorkspaceResponse:
        request = monitor_pb2.DiffWorkspaceRequest(
            workspace_id=workspace_id, base=base, target=target, max_bytes=max_bytes
        )
        response: monitor_pb2.DiffWorkspaceResponse = await self._workspace_call(self._stub.DiffWorkspace, request)
        return response

    async def commit_workspace(
        self, workspace_id: str, message: str, *, request_id: str = ""
    ) -> monitor_pb2.CommitWorkspaceResponse:
        request = monitor_pb2.CommitWorkspaceRequest(
            workspace_id=workspace_id, message=message, request_id=request_id or str(uuid.uuid4())
        )
        response: monitor_pb2.CommitWorkspaceResponse = await self._workspace_call(self._stub.CommitWorkspace, request)
        return response

    async def reset_workspace(
        self, workspace_id: str, commit: str, *, remove_untracked: bool = False, request_id: str = ""
    ) -> monitor_pb2.Workspace:
        request = monitor_pb2.ResetWorkspaceRequest(
            workspace_id=workspace_id,
            commit=commit,
            remove_untracked=remove_untracked,
            request_id=request_id or str(uuid.uuid4()),
        )
        response: monitor_pb2.ResetWorkspaceResponse = await self._workspace_call(self._stub.ResetWorkspace, request)
        return response.workspace
