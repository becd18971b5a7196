"""The supervisor's public API as configured: who may call each method, and with which credentials."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from quarry.api_auth import (
    ALL_ROLES,
    API_KEY_FILE,
    ApiAccess,
    ApiAuthentication,
    ApiKeys,
    ApiPrincipal,
    KeyLoader,
    access_table,
    api_key_digest,
    parse_api_keys,
    parse_client_certificates,
)
from quarry.config import ConfigurationError, QuarrySettings, SupervisorSettings
from quarry.identity import ApiRole
from quarry.security import Tls

__all__ = ["CAMPAIGN_ACCESS", "SUPERVISOR_ACCESS", "api_guard", "how_to_get_a_key"]

log = logging.getLogger(__name__)

ANONYMOUS = ApiPrincipal("anonymous", ALL_ROLES)

SUPERVISOR_ACCESS: ApiAccess = access_table(
    reads=["GetRun", "ListRuns", "StreamRun", "ExportRun", "ListRunLedger"],
    by_role={ApiRole.RESEARCHER: ["StartRun", "CancelRun"], ApiRole.APPROVER: ["ApproveRun", "RejectRun"]},
)
# Starting and directing a campaign runs code on the monitor's host: an operator's.
CAMPAIGN_ACCESS: ApiAccess = access_table(
    reads=["GetCampaign", "ListCampaigns", "StreamCampaign", "ListLedgerRows", "GetCampaignReport"],
    by_role={
        ApiRole.OPERATOR: [
            "StartCampaign",
            "PauseCampaign",
            "ResumeCampaign",
            "StopCampaign",
            "SendDirective",
            # The writer's model calls are the operator's to spend.
            "WriteCampaignReport",
        ]
    },
)


def how_to_get_a_key(common: QuarrySettings) -> str:
    return (
        f"run the quarry command on the machine that ran `quarry up` (it reads {common.data_dir / API_KEY_FILE}), "
        "set QUARRY_API_KEY, or ask an operator for a key made with `quarry keys add`"
    )


def _static_keys(settings: SupervisorSettings) -> dict[bytes, ApiPrincipal]:
    keys = parse_api_keys(settings.api_keys)
    if settings.auth_token:  # the single token of earlier releases: an administrator's key
        keys[api_key_digest(settings.auth_token)] = ApiPrincipal("admin", ALL_ROLES)
    return keys


def api_guard(
    settings: SupervisorSettings, common: QuarrySettings, services: Mapping[str, ApiAccess], stored: KeyLoader
) -> ApiAuthentication:
    """The authentication of `services` (full name -> access table); `stored` reads the keys in the database.

    Open (no credential checked) only when QUARRY_SUPERVISOR_OPEN_API says so, and never while campaigns can
    run code.
    """
    static = _static_keys(settings)
    certificates = parse_client_certificates(settings.client_certificates)
    tls = Tls.from_settings(common)
    if certificates and not (tls and tls.require_client_certificate):
        # Without verified client certificates a common name proves nothing.
        raise ConfigurationError(
            "QUARRY_SUPERVISOR_CLIENT_CERTIFICATES names principals by certificate but mutual TLS is not on"
        )
    anonymous = None
    if settings.open_api:
        if settings.monitor_address:
            raise ConfigurationError(
                "QUARRY_SUPERVISOR_OPEN_API is refused while campaigns can run code on the monitor's host "
                "(QUARRY_SUPERVISOR_MONITOR_ADDRESS is set): give callers API keys (`quarry keys add`)"
            )
        log.warning("the public API is open (QUARRY_SUPERVISOR_OPEN_API): anyone who can reach it has every role")
        anonymous = ANONYMOUS
    keys = ApiKeys(static, stored, refresh_seconds=settings.api_key_refresh_seconds)
    return ApiAuthentication(
        services, keys, certificates=certificates, anonymous=anonymous, how_to_get_a_key=how_to_get_a_key(common)
    )
