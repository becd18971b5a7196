"""Typed async clients for Quarry services, with the retry rules the services expect.

Mutations carry a request_id, so a client can retry them after UNAVAILABLE or a
deadline without risking a duplicate: the service answers a repeat with the
original result.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from quarry import telemetry
from quarry.config import QuarrySettings
from quarry.security import ConnectionLimits, Tls, bearer_metadata
from quarry.streams import ResumePolicy, resumable_stream
from quarry.v1 import (
    campaign_pb2,
    campaign_pb2_grpc,
    common_pb2,
    monitor_pb2,
    monitor_pb2_grpc,
    scratchpad_pb2,
    scratchpad_pb2_grpc,
    supervisor_pb2,
    supervisor_pb2_grpc,
)

__all__ = [
    "CampaignClient",
    "Dialer",
    "MonitorClient",
    "QuarryClient",
    "RetryPolicy",
    "ScratchpadClient",
    "insecure_channel",
    "is_retryable",
    "is_terminal",
    "open_channel",
]

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def is_retryable(error: BaseException) -> bool:
    return isinstance(error, grpc.aio.AioRpcError) and error.code() in RETRYABLE


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying a safe-to-repeat call, and how each attempt is bounded."""

    total_seconds: float = 30.0
    attempt_timeout: float = 10.0
    initial_backoff: float = 0.05
    max_backoff: float = 2.0

    def retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception(is_retryable),
            stop=stop_after_delay(self.total_seconds),
            wait=wait_exponential_jitter(multiplier=self.initial_backoff, max=self.max_backoff),
            reraise=True,
        )

    async def call(self, method: Callable[..., Any], request: Message, *, extra_timeout: float = 0.0) -> Any:
        """One unary call, retried under this policy; each attempt bounded by attempt_timeout."""
        async for attempt in self.retrying():
            with attempt:
                return await method(request, timeout=self.attempt_timeout + extra_timeout)
        raise AssertionError("unreachable: the last failure is re-raised")


def open_channel(
    address: str, *, tls: Tls | None = None, limits: ConnectionLimits | None = None, token: str = ""
) -> grpc.aio.Channel:
    """A channel to a Quarry service: TLS when `tls` is given (with this process's certificate, for mutual
    TLS), traced when tracing is on, and carrying a bearer token on every call when `token` is set."""
    options = (limits or ConnectionLimits()).channel_options()
    # grpc files an interceptor under one kind of call only, so each kind gets its own.
    bearer = [_UnaryBearerToken(token), _StreamBearerToken(token)] if token else []
    interceptors = [*telemetry.client_interceptors(), *bearer]
    if tls is not None:
        return grpc.aio.secure_channel(address, tls.channel_credentials(), options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


@dataclass(frozen=True)
class Dialer:
    """How a service reaches the mesh's other services: TLS, connection limits, and its mesh token."""

    tls: Tls | None = None
    limits: ConnectionLimits | None = None
    token: str = ""

    @classmethod
    def from_settings(cls, common: QuarrySettings) -> Dialer:
        return cls(Tls.from_settings(common), ConnectionLimits.from_settings(common), common.mesh_token)

    def channel(self, address: str) -> grpc.aio.Channel:
        return open_channel(address, tls=self.tls, limits=self.limits, token=self.token)


def insecure_channel(address: str) -> grpc.aio.Channel:
    """A plaintext channel with the default limits (a laptop, tests)."""
    return open_channel(address)


if TYPE_CHECKING:
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
else:  # grpc's classes are not subscriptable at run time
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor


class _BearerToken:
    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token)

    def _with_token(self, details: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return details._replace(metadata=metadata)


class _UnaryBearerToken(_BearerToken, _UnaryUnary):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class _StreamBearerToken(_BearerToken, _UnaryStream):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class ScratchpadClient:
    def __init__(self, channel: grpc.aio.Channel, retry: RetryPolicy | None = None) -> None:
        self._stub = scratchpad_pb2_grpc.ScratchpadServiceStub(channel)
        self._retry = retry or RetryPolicy()

    async def create_thread(
        self, *, thread_id: str = "", title: str = "", labels: dict[str, str] | None = None, request_id: str = ""
    ) -> scratchpad_pb2.Thread:
        request = scratchpad_pb2.CreateThreadRequest(
            thread_id=thread_id, title=title, labels=labels or {}, request_id=request_id or str(uuid.uuid4())
        )
        response: scratchpad_pb2.CreateThreadResponse = await self._retry.call(self._stub.CreateThread, request)
        return response.thread

    async def get_thread(self, thread_id: str) -> scratchpad_pb2.Thread:
        request = scratchpad_pb2.GetThreadRequest(thread_id=thread_id)
        response: scratchpad_pb2.GetThreadResponse = await self._retry.call(self._stub.GetThread, request)
        return response.thread

    async def append(
        self,
        thread_id: str,
        *,
        kind: scratchpad_pb2.EntryKind.ValueType,
        author: common_pb2.Principal,
        content: str,
        sources: Sequence[common_pb2.Source] = (),
        request_id: str = "",
    ) -> scratchpad_pb2.AppendResponse:
        """Append once in effect: retries reuse the request_id, so a lost reply never duplicates."""
        request = scratchpad_pb2.AppendRequest(
            thread_id=thread_id,
            request_id=request_id or str(uuid.uuid4()),
            kind=kind,
            author=author,
            content=content,
            sources=sources,
        )
        response: scratchpad_pb2.AppendResponse = await self._retry.call(self._stub.Append, request)
        return response

    async def read_all(
        self, thread_id: str, *, after_sequence_no: int = 0, page_size: int = 1000
    ) -> list[scratchpad_pb2.Entry]:
        """Every entry committed after `after_sequence_no`, following pages to the end."""
        entries: list[scratchpad_pb2.Entry] = []
        token = ""
        while True:
            request = scratchpad_pb2.ReadRequest(
                thread_id=thread_id, after_sequence_no=after_sequence_no, page_size=page_size, page_token=token
            )
            page: scratchpad_pb2.ReadResponse = await self._retry.call(self._stub.Read, request)
            entries.extend(page.entries)
            token = page.next_page_token
            if not token:
                return entries

    async def watch(
        self,
        thread_id: str,
        *,
        after_sequence_no: int = 0,
        max_reconnects: int = 100,
        on_established: Callable[[], None] | None = None,
    ) -> AsyncIterator[scratchpad_pb2.Entry]:
        """Entries as they commit; reconnects after UNAVAILABLE from the last one received.

        `on_established` is called each time the service has accepted the stream,
        before any entry arrives: from then on no commit can be missed.
        """

        async def open_after(after: int) -> AsyncIterator[scratchpad_pb2.Entry]:
            call = self._stub.Watch(scratchpad_pb2.WatchRequest(thread_id=thread_id, after_sequence_no=after))
            await call.initial_metadata()
            if on_established is not None:
                on_established()
            return (response.entry async for response in call)

        entries = resumable_stream(
            open_after,
            _sequence_no,
            after=after_sequence_no,
            # Waits, with backoff, until the service answers again.
            wait_until_back=lambda: self.get_thread(thread_id),
            policy=ResumePolicy(max_reconnects=max_reconnects),
        )
        async for entry in entries:
            yield entry


def _sequence_no(item: scratchpad_pb2.Entry | supervisor_pb2.RunEvent | campaign_pb2.CampaignEvent) -> int:
    return item.sequence_no


_TERMINAL_EVENTS = frozenset({"completed", "failed", "cancelled"})


def is_terminal(event: supervisor_pb2.RunEvent) -> bool:
    """True for a run's last event: completed, failed or cancelled."""
    return event.WhichOneof("payload") in _TERMINAL_EVENTS


class QuarryClient:
    """The public research API: start runs, follow their events, fetch, list and cancel them.

    Use it as an async context manager, which owns the channel::

        async with QuarryClient.connect("127.0.0.1:7410") as quarry:
            run = await quarry.start_run("How tall is the Eiffel Tower?")
            async for event in quarry.stream_run(run.run_id):
                ...
    """

    def __init__(self, channel: grpc.aio.Channel, retry: RetryPolicy | None = None) -> None:
        self._channel = channel
        self._stub = supervisor_pb2_grpc.SupervisorServiceStub(channel)
        self._retry = retry or RetryPolicy()

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        token: str = "",
        tls: Tls | None = None,
        limits: ConnectionLimits | None = None,
        retry: RetryPolicy | None = None,
    ) -> QuarryClient:
        """A client owning its channel; `token` is sent as a bearer token, `tls` secures the channel."""
        return cls(open_channel(address, tls=tls, limits=limits, token=token), retry)

    async def __aenter__(self) -> QuarryClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self._channel.close(None)

    async def start_run(
        self,
        question: str,
        *,
        options: supervisor_pb2.RunOptions | None = None,
        labels: Mapping[str, str] | None = None,
        request_id: str = "",
    ) -> supervisor_pb2.Run:
        """Start a run; retried safely (the request_id makes a repeat return the same run)."""
        request = supervisor_pb2.StartRunRequest(
            question=question, options=options, labels=labels or {}, request_id=request_id or str(uuid.uuid4())
        )
        response: supervisor_pb2.StartRunResponse = await self._retry.call(self._stub.StartRun, request)
        return response.run

    async def get_run(self, run_id: str) -> supervisor_pb2.Run:
        request = supervisor_pb2.GetRunRequest(run_id=run_id)
        response: supervisor_pb2.GetRunResponse = await self._retry.call(self._stub.GetRun, request)
        return response.run

    async def list_runs(
        self,
        *,
        page_size: int = 0,
        page_token: str = "",
        state: supervisor_pb2.RunState.ValueType = supervisor_pb2.RUN_STATE_UNSPECIFIED,
    ) -> supervisor_pb2.ListRunsResponse:
        request = supervisor_pb2.ListRunsRequest(page_size=page_size, page_token=page_token, state=state)
        response: supervisor_pb2.ListRunsResponse = await self._retry.call(self._stub.ListRuns, request)
        return response

    async def cancel_run(self, run_id: str, reason: str = "") -> supervisor_pb2.Run:
        request = supervisor_pb2.CancelRunRequest(run_id=run_id, reason=reason)
        response: supervisor_pb2.CancelRunResponse = await self._retry.call(
            self._stub.CancelRun, request, extra_timeout=15
        )
        return response.run

    async def approve_run(self, run_id: str, comment: str = "") -> supervisor_pb2.Run:
        """Approve a run awaiting approval: it completes with its report (a repeat returns it)."""
        request = supervisor_pb2.ApproveRunRequest(run_id=run_id, comment=comment)
        response: supervisor_pb2.ApproveRunResponse = await self._retry.call(
            self._stub.ApproveRun, request, extra_timeout=15
        )
        return response.run

    async def reject_run(self, run_id: str, reason: str = "") -> supervisor_pb2.Run:
        """Reject a run awaiting approval: it fails with RUN_ERROR_CODE_REJECTED and the reason."""
        request = supervisor_pb2.RejectRunRequest(run_id=run_id, reason=reason)
        response: supervisor_pb2.RejectRunResponse = await self._retry.call(
            self._stub.RejectRun, request, extra_timeout=15
        )
        return response.run

    async def stream_run(
        self, run_id: str, *, after_sequence_no: int = 0, max_reconnects: int = 100
    ) -> AsyncIterator[supervisor_pb2.RunEvent]:
        """The run's events in order until its terminal event, re-attaching after UNAVAILABLE from the
        last one received: nothing is missed and nothing comes twice."""

        async def open_after(after: int) -> AsyncIterator[supervisor_pb2.RunEvent]:
            call = self._stub.StreamRun(supervisor_pb2.StreamRunRequest(run_id=run_id, after_sequence_no=after))
            return (response.event async for response in call)

        events = resumable_stream(
            open_after,
            _sequence_no,
            after=after_sequence_no,
            # Waits, with backoff, until the service answers again.
            wait_until_back=lambda: self.get_run(run_id),
            policy=ResumePolicy(max_reconnects=max_reconnects),
            done=is_terminal,
        )
        async for event in events:
            yield event


class CampaignClient:
    """The campaign API: start campaigns, follow their events, pause, resume, stop and direct them.

    It shares the supervisor's channel (and bearer token): CampaignService is served beside SupervisorService.
    """

    def __init__(self, channel: grpc.aio.Channel, retry: RetryPolicy | None = None) -> None:
        self._stub = campaign_pb2_grpc.CampaignServiceStub(channel)
        self._retry = retry or RetryPolicy()

    async def start_campaign(self, spec: campaign_pb2.CampaignSpec, *, request_id: str = "") -> campaign_pb2.Campaign:
        """Start a campaign; retried safely (the request_id makes a repeat return the same campaign)."""
        request = campaign_pb2.StartCampaignRequest(spec=spec, request_id=request_id or str(uuid.uuid4()))
        response: campaign_pb2.StartCampaignResponse = await self._retry.call(self._stub.StartCampaign, request)
        return response.campaign

    async def get_campaign(self, campaign_id: str) -> campaign_pb2.Campaign:
        request = campaign_pb2.GetCampaignRequest(campaign_id=campaign_id)
        response: campaign_pb2.GetCampaignResponse = await self._retry.call(self._stub.GetCampaign, request)
        return response.campaign

    async def list_campaigns(
        self,
        *,
        page_size: int = 0,
        page_token: str = "",
        state: campaign_pb2.CampaignState.ValueType = campaign_pb2.CAMPAIGN_STATE_UNSPECIFIED,
    ) -> campaign_pb2.ListCampaignsResponse:
        request = campaign_pb2.ListCampaignsRequest(page_size=page_size, page_token=page_token, state=state)
        response: campaign_pb2.ListCampaignsResponse = await self._retry.call(self._stub.ListCampaigns, request)
        return response

    async def pause_campaign(self, campaign_id: str, reason: str = "") -> campaign_pb2.Campaign:
        request = campaign_pb2.PauseCampaignRequest(campaign_id=campaign_id, reason=reason)
        response: campaign_pb2.PauseCampaignResponse = await self._retry.call(
            self._stub.PauseCampaign, request, extra_timeout=15
        )
        return response.campaign

    async def resume_campaign(self, campaign_id: str, reason: str = "") -> campaign_pb2.Campaign:
        request = campaign_pb2.ResumeCampaignRequest(campaign_id=campaign_id, reason=reason)
        response: campaign_pb2.ResumeCampaignResponse = await self._retry.call(self._stub.ResumeCampaign, request)
        return response.campaign

    async def stop_campaign(self, campaign_id: str, reason: str = "") -> campaign_pb2.Campaign:
        request = campaign_pb2.StopCampaignRequest(campaign_id=campaign_id, reason=reason)
        response: campaign_pb2.StopCampaignResponse = await self._retry.call(
            self._stub.StopCampaign, request, extra_timeout=15
        )
        return response.campaign

    async def send_directive(
        self, campaign_id: str, text: str, *, request_id: str = ""
    ) -> campaign_pb2.CampaignDirective:
        """Send a directive once in effect: retries reuse the request_id."""
        request = campaign_pb2.SendDirectiveRequest(
            campaign_id=campaign_id, text=text, request_id=request_id or str(uuid.uuid4())
        )
        response: campaign_pb2.SendDirectiveResponse = await self._retry.call(self._stub.SendDirective, request)
        return response.directive

    async def stream_campaign(
        self, campaign_id: str, *, after_sequence_no: int = 0, max_reconnects: int = 100
    ) -> AsyncIterator[campaign_pb2.CampaignEvent]:
        """The campaign's events in order until its ended event, re-attaching after UNAVAILABLE from the last
        one received: nothing is missed and nothing comes twice."""

        async def open_after(after: int) -> AsyncIterator[campaign_pb2.CampaignEvent]:
            call = self._stub.StreamCampaign(
                campaign_pb2.StreamCampaignRequest(campaign_id=campaign_id, after_sequence_no=after)
            )
            return (response.event async for response in call)

        events = resumable_stream(
            open_after,
            _sequence_no,
            after=after_sequence_no,
            wait_until_back=lambda: self.get_campaign(campaign_id),
            policy=ResumePolicy(max_reconnects=max_reconnects),
            done=lambda event: event.HasField("ended"),
        )
        async for event in events:
            yield event


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
