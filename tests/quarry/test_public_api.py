"""Pins the kernel's public surface, so a change to it is a deliberate one."""

from __future__ import annotations

import quarry.client
import quarry.config
import quarry.db
import quarry.errors
import quarry.server


def public(module: object) -> set[str]:
    return {
        name
        for name in vars(module)
        if not name.startswith("_") and getattr(vars(module)[name], "__module__", None) == module.__name__
    }  # type: ignore[attr-defined]


def test_server_api() -> None:
    assert {
        "create_server",
        "ServiceHost",
        "ServiceRegistration",
        "BoundServer",
        "serve_until_signalled",
        "ErrorTranslationInterceptor",
    } <= public(quarry.server)


def test_error_tree() -> None:
    errors = quarry.errors
    for name in [
        "InvalidArgument",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "FailedPrecondition",
        "Unavailable",
        "DeadlineExceeded",
        "Internal",
    ]:
        assert issubclass(getattr(errors, name), errors.QuarryError)
    assert callable(errors.to_rpc_status)


def test_config_client_and_db_api() -> None:
    assert {"QuarrySettings", "ServiceSettings", "ScratchpadSettings"} <= public(quarry.config)
    assert {"ScratchpadClient", "RetryPolicy", "insecure_channel"} <= public(quarry.client)
    assert {"Database", "create_engine", "upgrade_schema", "run_migrations"} <= public(quarry.db)
