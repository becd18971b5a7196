"""Deprecated: the clients moved to `quarry.clients` (one module per service); this module re-exports
them under their old names for one release. `QuarryClient` is now `RunsClient`, `CampaignClient`
`CampaignsClient`."""

from quarry.clients.campaigns import CampaignsClient as CampaignClient
from quarry.clients.channels import Dialer, insecure_channel, open_channel
from quarry.clients.monitor import MonitorClient
from quarry.clients.retry import RetryPolicy, is_retryable
from quarry.clients.runs import RunsClient as QuarryClient
from quarry.clients.runs import is_terminal
from quarry.clients.scratchpad import ScratchpadClient

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
