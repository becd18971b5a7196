"""`quarry serve NAME`: one service in the foreground, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from quarry import telemetry
from quarry.cli.registry import ServiceSpec
from quarry.config import ConfigurationError, QuarrySettings, ServiceSettings
from quarry.credentials import keep_private
from quarry.db import UnsupportedDatabase
from quarry.server import ServiceHost, serve_until_signalled, stop_signals

log = logging.getLogger(__name__)


def serve(
    spec: ServiceSpec,
    settings: ServiceSettings,
    common: QuarrySettings,
    *,
    port_file: Path | None,
    parent_pid: int | None,
) -> int:
    """Build the service's host and serve it; the exit status of `quarry serve`."""
    configure_logging(common, spec.name, settings)
    keep_private()
    if parent_pid:
        exit_with_parent(parent_pid)
    try:
        observability = telemetry.setup(
            spec.name,
            prometheus_address=settings.prometheus_address,
            trace_sql=common.trace_sql,
            trace_http=common.trace_http,
        )
    except ConfigurationError as error:
        print(f"quarry serve {spec.name}: {error}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as error:
        print(f"quarry serve {spec.name}: cannot set up telemetry: {error}", file=sys.stderr)
        return 1

    async def build_and_serve() -> int:
        requested = stop_signals()  # first: a Ctrl-C while the service builds stops it once built
        return await _serve(await spec.build(settings, common), port_file, requested)

    try:
        return asyncio.run(build_and_serve())
    except ConfigurationError as error:  # found while building (TLS files, say): status 2, as for any setting
        print(f"quarry serve {spec.name}: {error}", file=sys.stderr)
        return 2
    except (UnsupportedDatabase, SQLAlchemyError, OSError) as error:
        # Startup failures a user can fix: say what failed, without a traceback.
        print(f"quarry serve {spec.name}: cannot start: {error}", file=sys.stderr)
        return 1
    finally:
        observability.shutdown()  # exports what is still pending


def exit_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGTERM this process when its parent dies (a no-op elsewhere)."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signal.SIGTERM) != 0:
        return
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def configure_logging(common: QuarrySettings, service: str, settings: ServiceSettings) -> None:
    logging.getLogger("alembic").setLevel(logging.WARNING)
    keys = ("model_api_key", "search_api_key", "auth_token")
    secrets = [common.model_api_key, *(str(getattr(settings, key, "")) for key in keys)]
    # Exporter headers carry backend keys (e.g. x-honeycomb-team=KEY): their values are secrets too.
    for variable in (
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    ):
        secrets += [pair.partition("=")[2].strip() for pair in os.environ.get(variable, "").split(",") if "=" in pair]
    secrets = [secret for secret in secrets if secret and secret != "unused"]  # "unused" is the placeholder key
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(telemetry.JsonFormatter(service, secrets, text=common.log_format == "text"))
    logging.basicConfig(level=common.log_level.upper(), handlers=[handler], force=True)


async def _serve(host: ServiceHost, port_file: Path | None, requested: asyncio.Event) -> int:
    async def announce_port() -> None:
        await host.wait_started()
        if port_file is not None:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(host.address)
            tmp.replace(port_file)  # atomic: readers never see a partial address

    announcer = asyncio.create_task(announce_port())
    try:
        await serve_until_signalled(host, requested)
    finally:
        announcer.cancel()
    return 0
