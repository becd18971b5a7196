"""The campaign service's client."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from operator import attrgetter

import grpc

from quarry.clients.channels import ApiClient
from quarry.clients.retry import RetryPolicy
from quarry.streams import ResumePolicy, resumable_stream
from quarry.v1 import campaign_pb2, campaign_pb2_grpc

__all__ = ["CampaignsClient"]

# A report is two writer delegations at most (a draft and its repair), each bounded at ten minutes.
_WRITER_SECONDS = 1260.0


class CampaignsClient(ApiClient):
    """The campaign API: start campaigns, follow their events, pause, resume, stop and direct them.

    CampaignService is served beside SupervisorService: a client may share a RunsClient's channel (and its
    API key), or own one (`connect`, as an async context manager). Starting and directing campaigns runs
    code on the monitor's host: the key must hold the operator role.
    """

    def __init__(self, channel: grpc.aio.Channel, retry: RetryPolicy | None = None) -> None:
        super().__init__(channel, retry)
        self._stub = campaign_pb2_grpc.CampaignServiceStub(channel)

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

    async def list_ledger_rows(
        self, campaign_id: str, *, page_size: int = 0, page_token: str = ""
    ) -> campaign_pb2.ListLedgerRowsResponse:
        """One page of the campaign's ledger, each row with the signals after it."""
        request = campaign_pb2.ListLedgerRowsRequest(
            campaign_id=campaign_id, page_size=page_size, page_token=page_token
        )
        response: campaign_pb2.ListLedgerRowsResponse = await self._retry.call(self._stub.ListLedgerRows, request)
        return response

    async def write_campaign_report(self, campaign_id: str, *, request_id: str = "") -> campaign_pb2.CampaignReport:
        """Have the writer write the campaign's report now (minutes: a model writes it); retries reuse the
        request_id, so they get the report the first call wrote."""
        request = campaign_pb2.WriteCampaignReportRequest(
            campaign_id=campaign_id, request_id=request_id or str(uuid.uuid4())
        )
        response: campaign_pb2.WriteCampaignReportResponse = await self._retry.call(
            self._stub.WriteCampaignReport, request, extra_timeout=_WRITER_SECONDS
        )
        return response.report

    async def get_campaign_report(self, campaign_id: str) -> campaign_pb2.CampaignReport:
        """The campaign's latest report; NOT_FOUND before one was written."""
        request = campaign_pb2.GetCampaignReportRequest(campaign_id=campaign_id)
        response: campaign_pb2.GetCampaignReportResponse = await self._retry.call(self._stub.GetCampaignReport, request)
        return response.report

    async def ledger(self, campaign_id: str) -> list[campaign_pb2.LedgerRow]:
        """The campaign's whole ledger so far, following pages to the end."""
        rows: list[campaign_pb2.LedgerRow] = []
        token = ""
        while True:
            page = await self.list_ledger_rows(campaign_id, page_token=token)
            rows.extend(page.rows)
            token = page.next_page_token
            if not token:
                return rows

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
            attrgetter("sequence_no"),
            after=after_sequence_no,
            wait_until_back=lambda: self.get_campaign(campaign_id),
            policy=ResumePolicy(max_reconnects=max_reconnects),
            done=lambda event: event.HasField("ended"),
        )
        async for event in events:
            yield event
