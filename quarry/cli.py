"""The `quarry` command: `serve` one service, or bring the whole mesh `up`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings
from sqlalchemy.exc import SQLAlchemyError

from quarry.config import ConfigurationError, QuarrySettings, describe_invalid
from quarry.db import UnsupportedDatabase
from quarry.server import ServiceHost, serve_until_signalled
from quarry.services import SERVICES

CONFIGURATION_HELP = """configuration:
  QUARRY_* environment variables (QUARRY_DATA_DIR, QUARRY_LOG_LEVEL,
  QUARRY_SCRATCHPAD_ADDRESS, QUARRY_SCRATCHPAD_DATABASE_URL, ...), or a TOML
  file named by QUARRY_CONFIG_FILE with a [quarry] table and one table per
  service ([scratchpad]); the environment wins. README.md lists every setting."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quarry",
        description="Quarry deep-research mesh",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command")

    serve = commands.add_parser(
        "serve",
        help="run one service in the foreground",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("service", choices=sorted(SERVICES))
    serve.add_argument("--address", help="HOST:PORT to listen on (port 0 picks a free one)")
    serve.add_argument("--port-file", type=Path, help="write the bound HOST:PORT here once serving")
    # Set by `quarry up`: stop when that process dies, however it dies.
    serve.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)

    up = commands.add_parser(
        "up",
        help="start every service as its own process",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("--data-dir", type=Path, help="where SQLite databases live (default: QUARRY_DATA_DIR)")
    up.add_argument(
        "--ephemeral-ports", action="store_true", help="bind every service to a free port instead of its default"
    )
    up.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for each service")

    corpus = commands.add_parser("corpus", help="the local document corpus the workers search")
    corpus_commands = corpus.add_subparsers(dest="corpus_command", required=True)
    index = corpus_commands.add_parser(
        "index", help="index (or re-index) a folder of Markdown, HTML, text and PDF files"
    )
    index.add_argument("folder", type=Path)
    index.add_argument("--index", type=Path, help="index file (default: corpus.db in the data directory)")

    address_help = "the supervisor's HOST:PORT (default: QUARRY_SUPERVISOR_ADDRESS, else 127.0.0.1:7410)"
    ask = commands.add_parser("ask", help="research a question and follow the run live")
    ask.add_argument("question")
    ask.add_argument("--address", help=address_help)
    ask.add_argument("--json", action="store_true", help="print one JSON object per event instead")
    ask.add_argument("--max-turns", type=int, default=0, help="bound on supervisor turns (default 12)")
    ask.add_argument("--worker-max-turns", type=int, default=0, help="bound on each worker's turns (default 8)")
    ask.add_argument("--parallel", type=int, default=0, help="delegations at once (default: the server's)")
    ask.add_argument("--max-tokens", type=int, default=0, help="token budget for the whole run (default: none)")
    ask.add_argument("--timeout", type=float, default=0, help="seconds the run may take (default: the server's)")

    runs = commands.add_parser("runs", help="list research runs or show one")
    runs_commands = runs.add_subparsers(dest="runs_command", required=True)
    runs_list = runs_commands.add_parser("list", help="the newest runs")
    runs_list.add_argument("--state", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    runs_list.add_argument("--limit", type=int, default=20)
    runs_list.add_argument("--json", action="store_true")
    runs_list.add_argument("--address", help=address_help)
    runs_show = runs_commands.add_parser("show", help="one run: state, report, citations, usage")
    runs_show.add_argument("run_id")
    runs_show.add_argument("--json", action="store_true")
    runs_show.add_argument("--address", help=address_help)

    migrate = commands.add_parser(
        "migrate",
        help="upgrade each service's database schema, then exit (a Kubernetes Job before a rollout)",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    migrate.add_argument("services", nargs="*", help="scratchpad, worker and/or supervisor (default: all)")

    commands.add_parser(
        "doctor",
        help="check services, model endpoint, search backend and databases",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def _index_corpus(folder: Path, index: Path) -> int:
    from worker_svc.corpus import Corpus

    try:
        report = Corpus(index).index_folder(folder)
    except OSError as error:
        print(f"quarry corpus index: {error}", file=sys.stderr)
        return 2
    for path, why in report.skipped:
        print(f"skipped {path}: {why}", file=sys.stderr)
    print(
        f"{index}: {len(report.added)} added, {len(report.updated)} updated, {len(report.removed)} removed, "
        f"{report.unchanged} unchanged, {len(report.skipped)} skipped"
    )
    return 0


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


def _configure_logging(common: QuarrySettings, service: str, settings: BaseSettings) -> None:
    from quarry.telemetry import JsonFormatter

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
    handler.setFormatter(JsonFormatter(service, secrets, text=common.log_format == "text"))
    logging.basicConfig(level=common.log_level.upper(), handlers=[handler], force=True)


async def _serve(host: ServiceHost, port_file: Path | None) -> int:
    async def announce_port() -> None:
        await host.wait_started()
        if port_file is not None:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(host.address)
            tmp.replace(port_file)  # atomic: readers never see a partial address

    announcer = asyncio.create_task(announce_port())
    try:
        await serve_until_signalled(host)
    finally:
        announcer.cancel()
    return 0


# Services with a database, and where their migrations live ("module" with MIGRATIONS and VERSION_TABLE).
MIGRATING = {
    "scratchpad": "scratchpad_svc.service",
    "worker": "worker_svc.service",
    "supervisor": "supervisor_svc.service",
}


def _migrate(common: QuarrySettings, services: Sequence[str]) -> int:
    import importlib

    from quarry.db import upgrade_schema

    for name in services:
        module = importlib.import_module(MIGRATING[name])
        settings = _load(SERVICES[name].settings_type())
        url = settings.resolved_database_url(common.data_dir)
        try:
            upgrade_schema(url, module.MIGRATIONS, module.VERSION_TABLE)
        except (UnsupportedDatabase, SQLAlchemyError, OSError) as error:
            print(f"quarry migrate {name}: {error}", file=sys.stderr)
            return 1
        print(f"{name}: schema up to date")
    return 0


def _client_command(args: argparse.Namespace) -> int:
    from quarry import ask
    from quarry.client import QuarryClient
    from quarry.config import SupervisorSettings
    from quarry.security import ConnectionLimits, Tls
    from quarry.v1 import supervisor_pb2

    supervisor, common = _load(SupervisorSettings), _load(QuarrySettings)
    address = args.address or supervisor.address
    tls, limits = Tls.from_settings(common), ConnectionLimits.from_settings(common)

    def connect() -> QuarryClient:
        return QuarryClient.connect(address, token=supervisor.auth_token, tls=tls, limits=limits)

    if args.command == "runs":
        if args.runs_command == "list":
            return ask.run_client_command(ask.list_runs(connect, args.state or "", args.limit, as_json=args.json))
        return ask.run_client_command(ask.show_run(connect, args.run_id, as_json=args.json))
    options = supervisor_pb2.RunOptions(
        max_supervisor_turns=args.max_turns,
        max_worker_turns=args.worker_max_turns,
        max_parallel_delegations=args.parallel,
        max_tokens=args.max_tokens,
    )
    if args.timeout:
        options.timeout.FromNanoseconds(int(args.timeout * 1e9))
    return ask.run_client_command(ask.ask(connect, args.question, options, as_json=args.json))


SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def _load(settings_type: type[SettingsT], **overrides: Any) -> SettingsT:
    try:
        return settings_type(**overrides)
    except ValidationError as error:
        raise ConfigurationError(describe_invalid(settings_type, error)) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        common = _load(QuarrySettings)
        if args.command == "serve":
            spec = SERVICES[args.service]
            settings = _load(spec.settings_type(), **({"address": args.address} if args.address else {}))
    except ConfigurationError as error:
        print(f"quarry: {error}", file=sys.stderr)
        return 2
    if args.command == "serve":
        _configure_logging(common, args.service, settings)
        if args.parent_pid:
            exit_with_parent(args.parent_pid)
        from quarry import telemetry

        try:
            observability = telemetry.setup(args.service, prometheus_address=settings.prometheus_address)
        except (OSError, ValueError) as error:
            print(f"quarry serve {args.service}: cannot set up telemetry: {error}", file=sys.stderr)
            return 1

        async def build_and_serve() -> int:
            return await _serve(await spec.build(settings, common), args.port_file)

        try:
            return asyncio.run(build_and_serve())
        except (UnsupportedDatabase, SQLAlchemyError, OSError, ConfigurationError) as error:
            # Startup failures a user can fix: say what failed, without a traceback.
            print(f"quarry serve {args.service}: cannot start: {error}", file=sys.stderr)
            return 1
        finally:
            observability.shutdown()  # exports what is still pending
    if args.command == "up":
        from quarry.launcher import Announcer, run_mesh

        if args.data_dir:
            os.environ["QUARRY_DATA_DIR"] = str(args.data_dir.resolve())
        addresses = {name: "127.0.0.1:0" for name in SERVICES} if args.ephemeral_ports else {}
        return asyncio.run(
            run_mesh(
                list(SERVICES.values()),
                addresses=addresses,
                ready_timeout=args.ready_timeout,
                stop_timeout=common.shutdown_grace_seconds + 5.0,
                announce=Announcer(data_dir=Path(os.environ.get("QUARRY_DATA_DIR") or common.data_dir)),
            )
        )
    if args.command == "corpus":
        return _index_corpus(args.folder, args.index or common.data_dir / "corpus.db")
    if args.command in ("ask", "runs"):
        try:
            return _client_command(args)
        except ConfigurationError as error:
            print(f"quarry: {error}", file=sys.stderr)
            return 2
    if args.command == "migrate":
        unknown = sorted(set(args.services) - set(MIGRATING))
        if unknown:
            print(
                f"quarry migrate: no database for {', '.join(unknown)}; choose from {', '.join(MIGRATING)}",
                file=sys.stderr,
            )
            return 2
        return _migrate(common, args.services or list(MIGRATING))
    if args.command == "doctor":
        from quarry.doctor import doctor

        try:
            return doctor(common)
        except ConfigurationError as error:
            print(f"quarry: {error}", file=sys.stderr)
            return 2
    raise AssertionError(f"unhandled command {args.command}")
