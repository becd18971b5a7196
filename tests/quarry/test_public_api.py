"""Pins the kernel's public surface: a change to it must be a deliberate edit here too."""

from __future__ import annotations

import types

import quarry.client
import quarry.config
import quarry.convert
import quarry.db
import quarry.errors
import quarry.ids
import quarry.security
import quarry.server
import quarry.telemetry
import quarry.vocabulary

PUBLIC_API = {
    quarry.server: {
        "BoundServer",
        "ErrorTranslationInterceptor",
        "ServiceHost",
        "ServiceRegistration",
        "create_server",
        "serve_until_signalled",
        "service_host",
    },
    quarry.errors: {
        "AlreadyExists",
        "DeadlineExceeded",
        "ErrorReason",
        "FailedPrecondition",
        "FieldViolation",
        "Internal",
        "InvalidArgument",
        "NotFound",
        "PermissionDenied",
        "QuarryError",
        "ResourceExhausted",
        "Unauthenticated",
        "Unavailable",
        "Unimplemented",
        "internal_status",
        "to_rpc_status",
    },
    quarry.client: {
        "MonitorClient",
        "QuarryClient",
        "RetryPolicy",
        "ScratchpadClient",
        "insecure_channel",
        "is_retryable",
        "open_channel",
        "is_terminal",
    },
    quarry.config: {
        "ConfigurationError",
        "ModelTier",
        "MonitorSettings",
        "QuarrySettings",
        "ScratchpadSettings",
        "ServiceSettings",
        "SshHost",
        "SupervisorSettings",
        "WorkerSettings",
        "describe_invalid",
    },
    quarry.security: {"BearerTokenInterceptor", "ConnectionLimits", "Tls", "TlsConfigurationError", "bearer_metadata"},
    quarry.telemetry: {
        "JsonFormatter",
        "Telemetry",
        "client_interceptors",
        "meter",
        "quiet",
        "record_failure",
        "server_interceptors",
        "setup",
        "tracer",
        "tracing_enabled",
    },
    quarry.convert: {
        "DELEGATION_ERROR_CODES",
        "ENTRY_KINDS",
        "ROLES",
        "EnumMap",
        "duration",
        "duration_seconds",
        "enum_label",
        "timestamp",
        "usage_from_proto",
        "usage_to_proto",
    },
    quarry.ids: {
        "DELEGATION_ID",
        "LABEL_KEY",
        "PRINCIPAL_ID",
        "REQUEST_ID",
        "RUN_ID",
        "RUN_REFERENCE",
        "THREAD_ID",
        "TOOL_CALL_ID",
        "IdRule",
        "new_conversation_id",
        "new_run_id",
        "violations",
    },
    quarry.vocabulary: {"DelegationErrorCode", "EntryKind"},
    quarry.db: {
        "Database",
        "UTCDateTime",
        "UnsupportedDatabase",
        "create_engine",
        "database_url",
        "json_type",
        "open_migrated_database",
        "reserve_sequence_numbers",
        "run_migrations",
        "schema_revisions",
        "upgrade_schema",
        "upgrade_schema_async",
    },
}


def test_each_module_exports_exactly_its_public_api() -> None:
    for module, names in PUBLIC_API.items():
        assert set(module.__all__) == names, module.__name__
        for name in names:
            value = getattr(module, name)
            if isinstance(value, type | types.FunctionType):  # defined here, not re-exported
                assert value.__module__ == module.__name__, f"{module.__name__}.{name}"


def test_every_public_name_is_exported() -> None:
    for module, names in PUBLIC_API.items():
        defined_here = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        }
        assert defined_here <= names, module.__name__


def test_status_errors_derive_from_one_base() -> None:
    for name in PUBLIC_API[quarry.errors]:
        value = getattr(quarry.errors, name)
        if isinstance(value, type) and name not in {"ErrorReason", "FieldViolation", "QuarryError"}:
            assert issubclass(value, quarry.errors.QuarryError)
