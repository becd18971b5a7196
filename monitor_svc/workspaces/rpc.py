"""MonitorService's workspace RPCs: each translates its request to a Workspaces call and the answer back."""

from __future__ import annotations

from typing import Any

import grpc

from monitor_svc.workspaces.operations import Workspaces
from monitor_svc.workspaces.types import EntryKind, TreeEntry, Workspace
from quarry.v1 import monitor_pb2, monitor_pb2_grpc

_KINDS = {
    EntryKind.FILE: monitor_pb2.WORKSPACE_ENTRY_KIND_FILE,
    EntryKind.DIRECTORY: monitor_pb2.WORKSPACE_ENTRY_KIND_DIRECTORY,
    EntryKind.SYMLINK: monitor_pb2.WORKSPACE_ENTRY_KIND_SYMLINK,
    EntryKind.OTHER: monitor_pb2.WORKSPACE_ENTRY_KIND_OTHER,
}
Context = grpc.aio.ServicerContext[Any, Any]


def _shown(text: str) -> str:
    """A name from a host's file system as valid UTF-8 (undecodable bytes replaced), which protobuf needs."""
    return text.encode(errors="surrogateescape").decode(errors="replace")


def workspace_to_proto(workspace: Workspace) -> monitor_pb2.Workspace:
    record, state = workspace.record, workspace.git
    return monitor_pb2.Workspace(
        workspace_id=record.workspace_id,
        host=record.host,
        root=_shown(record.root),
        protected_paths=record.protected_paths,
        git=monitor_pb2.WorkspaceGitState(
            is_repo=state.is_repo, head_commit=state.head_commit, branch=state.branch, dirty=state.dirty
        ),
    )


def _entry_to_proto(entry: TreeEntry) -> monitor_pb2.WorkspaceEntry:
    return monitor_pb2.WorkspaceEntry(
        path=_shown(entry.path), kind=_KINDS[entry.kind], size_bytes=entry.size, children_omitted=entry.children_omitted
    )


class WorkspaceServicer(monitor_pb2_grpc.MonitorServiceServicer):
    def __init__(self, workspaces: Workspaces) -> None:
        self._workspaces = workspaces

    async def OpenWorkspace(
        self, request: monitor_pb2.OpenWorkspaceRequest, context: Context
    ) -> monitor_pb2.OpenWorkspaceResponse:
        workspace = await self._workspaces.open(
            request.host, request.root, list(request.protected_paths), request.request_id
        )
        return monitor_pb2.OpenWorkspaceResponse(workspace=workspace_to_proto(workspace))

    async def GetWorkspace(
        self, request: monitor_pb2.GetWorkspaceRequest, context: Context
    ) -> monitor_pb2.GetWorkspaceResponse:
        workspace = await self._workspaces.get(request.workspace_id)
        return monitor_pb2.GetWorkspaceResponse(workspace=workspace_to_proto(workspace))

    async def ListWorkspaceTree(
        self, request: monitor_pb2.ListWorkspaceTreeRequest, context: Context
    ) -> monitor_pb2.ListWorkspaceTreeResponse:
        tree = await self._workspaces.tree(request.workspace_id, request.path, request.max_depth, request.max_entries)
        return monitor_pb2.ListWorkspaceTreeResponse(
            entries=[_entry_to_proto(entry) for entry in tree.entries], truncated=tree.truncated
        )

    async def ReadWorkspaceFile(
        self, request: monitor_pb2.ReadWorkspaceFileRequest, context: Context
    ) -> monitor_pb2.ReadWorkspaceFileResponse:
        text = await self._workspaces.read(
            request.workspace_id, request.path, request.start_line, request.end_line, request.max_bytes
        )
        return monitor_pb2.ReadWorkspaceFileResponse(
            content=text.content,
            start_line=text.start_line,
            end_line=text.end_line,
            size_bytes=text.size,
            truncated=text.truncated,
            binary=text.binary,
        )

    async def SearchWorkspace(
        self, request: monitor_pb2.SearchWorkspaceRequest, context: Context
    ) -> monitor_pb2.SearchWorkspaceResponse:
        result = await self._workspaces.search(
            request.workspace_id,
            request.pattern,
            request.path,
            request.glob,
            request.case_insensitive,
            request.max_matches,
        )
        return monitor_pb2.SearchWorkspaceResponse(
            matches=[
                monitor_pb2.SearchMatch(path=_shown(match.path), line_number=match.line_number, line=match.line)
                for match in result.matches
            ],
            truncated=result.truncated,
            files_scanned=result.files_scanned,
            bytes_scanned=result.bytes_scanned,
        )

    async def WriteWorkspaceFile(
        self, request: monitor_pb2.WriteWorkspaceFileRequest, context: Context
    ) -> monitor_pb2.WriteWorkspaceFileResponse:
        written = await self._workspaces.write(request.workspace_id, request.path, request.content, request.request_id)
        return monitor_pb2.WriteWorkspaceFileResponse(size_bytes=written.size, created=written.created)

    async def PatchWorkspace(
        self, request: monitor_pb2.PatchWorkspaceRequest, context: Context
    ) -> monitor_pb2.PatchWorkspaceResponse:
        patched = await self._workspaces.patch(request.workspace_id, request.patch, request.request_id)
        return monitor_pb2.PatchWorkspaceResponse(
            modified_paths=[_shown(p) for p in patched.modified],
            created_paths=[_shown(p) for p in patched.created],
            deleted_paths=[_shown(p) for p in patched.deleted],
        )

    async def CreateWorkspaceBranch(
        self, request: monitor_pb2.CreateWorkspaceBranchRequest, context: Context
    ) -> monitor_pb2.CreateWorkspaceBranchResponse:
        workspace = await self._workspaces.create_branch(
            request.workspace_id, request.branch, request.start_point, request.request_id
        )
        return monitor_pb2.CreateWorkspaceBranchResponse(workspace=workspace_to_proto(workspace))

    async def DiffWorkspace(
        self, request: monitor_pb2.DiffWorkspaceRequest, context: Context
    ) -> monitor_pb2.DiffWorkspaceResponse:
        diff = await self._workspaces.diff(request.workspace_id, request.base, request.target, request.max_bytes)
        return monitor_pb2.DiffWorkspaceResponse(
            diff=diff.text,
            truncated=diff.truncated,
            base_commit=diff.base_commit,
            target_commit=diff.target_commit,
            untracked_paths=[_shown(path) for path in diff.untracked],
        )

    async def CommitWorkspace(
        self, request: monitor_pb2.CommitWorkspaceRequest, context: Context
    ) -> monitor_pb2.CommitWorkspaceResponse:
        commit = await self._workspaces.commit(request.workspace_id, request.message, request.request_id)
        return monitor_pb2.CommitWorkspaceResponse(
            commit=commit.commit,
            committed=commit.committed,
            changed_paths=commit.changed_paths,
            changed_paths_truncated=commit.changed_paths_truncated,
        )

    async def ResetWorkspace(
        self, request: monitor_pb2.ResetWorkspaceRequest, context: Context
    ) -> monitor_pb2.ResetWorkspaceResponse:
        workspace = await self._workspaces.reset(
            request.workspace_id, request.commit, request.remove_untracked, request.request_id
        )
        return monitor_pb2.ResetWorkspaceResponse(workspace=workspace_to_proto(workspace))
