"""What a campaign's readers ask of its ledger: the signals now, and the rows, paged, each with the signals after it.

The ledger is read back from the campaign's event log (one ledger_recorded event per cycle), the log StreamCampaign
serves, so GetCampaign, ListLedgerRows and a stream agree. The signals are computed by the kernel's pure
`read_signals`, the function the loop's THINK and REFLECT read.
"""

from __future__ import annotations

import inspect

from quarry import paging
from quarry.errors import FieldViolation, InvalidArgument
from quarry.records.campaign import TrialRecord
from quarry.records.contract import ledger_record, ledger_rows
from quarry.records.signals import Signals, read_signals
from quarry.v1 import campaign_pb2
from supervisor_svc.campaigns.service import Campaigns
from supervisor_svc.campaigns.state import CampaignRecord

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


async def recorded_ledger(campaigns: Campaigns, campaign_id: str) -> tuple[CampaignRecord, list[TrialRecord]]:
    """The campaign and its ledger so far, in cycle order (up to the newest event when it was read)."""
    record = await campaigns.get(campaign_id)
    ledger: list[TrialRecord] = []
    if not record.last_sequence_no:
        return record, ledger
    stream = await campaigns.events(campaign_id, 0)
    try:
        async for stored in stream:
            event = campaign_pb2.CampaignEvent.FromString(stored.payload)
            if event.HasField("ledger_recorded"):
                ledger.append(ledger_record(event.ledger_recorded))
            if stored.sequence_no >= record.last_sequence_no:
                break  # a live campaign's stream would wait for its next event
    finally:
        if inspect.isasyncgen(stream):
            await stream.aclose()
    return record, ledger


async def standing(campaigns: Campaigns, campaign_id: str) -> tuple[CampaignRecord, Signals]:
    """The campaign and its signals after its whole ledger."""
    record, ledger = await recorded_ledger(campaigns, campaign_id)
    return record, read_signals(ledger, record.spec.metric.goal, record.spec.signal_rules())


async def ledger_page(
    campaigns: Campaigns, campaign_id: str, page_size: int, page_token: str
) -> tuple[list[campaign_pb2.LedgerRow], str]:
    """One page of the campaign's ledger rows, each with the signals after it, and the next page's token."""
    if page_size < 0:
        raise InvalidArgument([FieldViolation("page_size", "must not be negative")])
    start = _start(campaign_id, page_token)
    record, ledger = await recorded_ledger(campaigns, campaign_id)
    limit = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    # The signals after a row depend on every row before it, so the whole ledger is read.
    rows = ledger_rows(ledger[: start + limit], record.spec.metric.goal, record.spec.signal_rules(), first=start)
    end = start + len(rows)
    return rows, paging.encode_token(f"v1:{campaign_id}:{end}") if end < len(ledger) else ""


def _start(campaign_id: str, page_token: str) -> int:
    """How many rows the pages before this one held; 0 for the first page."""
    if not page_token:
        return 0
    version, _, rest = (paging.decode_token(page_token) or "").partition(":")
    token_campaign, _, start = rest.rpartition(":")
    if version != "v1" or token_campaign != campaign_id or not start.isdecimal():
        raise InvalidArgument([FieldViolation("page_token", "not a token ListLedgerRows gave for this campaign")])
    return int(start)
