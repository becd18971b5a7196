"""The environment of each process `quarry up` starts: the basics, and the settings that service reads.

Nothing else of `quarry up`'s own environment is passed on: not another service's settings, not a
credential the service does not use, not the unrelated secrets of the shell it was started from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from quarry.cli.registry import SERVICES, ServiceSpec
from quarry.config import CONFIG_FILE_ENV, ModelTier, QuarrySettings, ServiceSettings
from quarry.credentials import FILE_SUFFIX, credentials

# What a Python process (and a job the monitor starts) needs to run and find its files; none is a secret.
BASICS = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONHOME"}
    | {"VIRTUAL_ENV", "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR"}
)
# Locale; gRPC's own (DNS resolver, trace flags); OpenTelemetry's, which every service exports with:
# OTEL_EXPORTER_OTLP_HEADERS may carry the collector's key, which each service needs to export (the
# monitor keeps every OTEL_* variable from the jobs it starts).
BASIC_PREFIXES = ("LC_", "GRPC_", "OTEL_")
# A proxy for outbound HTTP, which only the services that call a model (and the web) make; its URL may hold a password.
PROXIES = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"})


def _prefix(settings: type[ServiceSettings] | type[QuarrySettings]) -> str:
    return str(settings.model_config.get("env_prefix", ""))


def _variables(settings: type[ServiceSettings] | type[QuarrySettings], names: set[str]) -> set[str]:
    """The variables of those settings, a credential's VARIABLE_FILE included."""
    secret = set(credentials(settings))
    found = set()
    for name in names:
        variable = f"{_prefix(settings)}{name.upper()}"
        found |= {variable, variable + FILE_SUFFIX} if name in secret else {variable}
    return found


def _settings_read_by(spec: ServiceSpec) -> tuple[str, set[str]]:
    """The settings `spec`'s process reads: every variable with its own prefix, and these others.

    Its own prefix carries a setting added later without a change here. Of the shared settings, it
    reads every one but the credentials, of which it gets the model key only if it calls a model (its
    settings have a tier of their own to fall back from) and the mesh token only if it calls another
    service. It reads the model settings of the tiers it runs for other services (the worker runs the
    supervisor tier's roles).
    """
    own = spec.settings_type()
    shared = set(QuarrySettings.model_fields) - set(credentials(QuarrySettings))
    shared |= set(credentials(QuarrySettings)) & set(own.model_fields)
    if spec.mesh_role is not None:
        shared.add("mesh_token")
    others = _variables(QuarrySettings, shared) | {CONFIG_FILE_ENV}
    tier_fields = set(ModelTier.model_fields) - set(ServiceSettings.model_fields)
    for name in spec.model_tiers:
        others |= _variables(SERVICES[name].settings_type(), tier_fields)
    return _prefix(own), others


def service_environment(parent: Mapping[str, str], spec: ServiceSpec, data_dir: Path) -> dict[str, str]:
    """What of `parent` (quarry up's environment) the service's process gets, and the data directory."""
    prefix, settings = _settings_read_by(spec)
    calls_out = issubclass(spec.settings_type(), ModelTier)

    def passed(name: str) -> bool:
        if name in BASICS or name.startswith(BASIC_PREFIXES):
            return True
        if name.upper() in PROXIES:  # lower case too, as curl and httpx read them
            return calls_out
        return name.startswith(prefix) or name in settings

    # Its own data directory even where the default depends on variables it does not get (XDG_DATA_HOME).
    return {**{name: value for name, value in parent.items() if passed(name)}, "QUARRY_DATA_DIR": str(data_dir)}
