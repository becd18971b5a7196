"""The `quarry` command: its arguments, and one small handler per command."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from quarry.cli.launcher import RestartPolicy
from quarry.cli.registry import SERVICES, databases
from quarry.cli.settings import load_settings
from quarry.config import ConfigurationError, QuarrySettings
from quarry.db import UnsupportedDatabase

if TYPE_CHECKING:
    from quarry.cli.ask import Supervisor

CONFIGURATION_HELP = """configuration:
  QUARRY_* environment variables (QUARRY_DATA_DIR, QUARRY_LOG_LEVEL,
  QUARRY_SCRATCHPAD_ADDRESS, QUARRY_SCRATCHPAD_DATABASE_URL, ...), or a TOML
  file named by QUARRY_CONFIG_FILE with a [quarry] table and one table per
  service ([scratchpad]); the environment wins. docs/settings.md lists every setting."""


def _positive(text: str) -> int:
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return number


def _not_negative(text: str) -> int:
    number = int(text)
    if number < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return number


def _parser() -> argparse.ArgumentParser:
    # Every command but `serve` takes it: where the databases, the corpus and a running `quarry up`'s
    # addresses (mesh.json) are.
    data_dir = argparse.ArgumentParser(add_help=False)
    data_dir.add_argument(
        "--data-dir", type=Path, help="the data directory (default: QUARRY_DATA_DIR, else ~/.local/share/quarry)"
    )
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
        parents=[data_dir],
        help="start every service as its own process, and restart any that dies",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument(
        "--ephemeral-ports", action="store_true", help="bind every service to a free port instead of its default"
    )
    up.add_argument("--workers", type=_positive, default=1, help="worker processes (default 1)")
    up.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for each service")
    up.add_argument(
        "--max-restarts",
        type=_not_negative,
        default=RestartPolicy.max_restarts,
        help=f"restarts of one service within {RestartPolicy.window_seconds:g} s before quarry up gives up and "
        f"stops (default {RestartPolicy.max_restarts})",
    )

    corpus = commands.add_parser("corpus", help="the local document corpus the workers search")
    corpus_commands = corpus.add_subparsers(dest="corpus_command", required=True)
    index_file = argparse.ArgumentParser(add_help=False, parents=[data_dir])
    index_file.add_argument(
        "--index",
        type=Path,
        help="index file (default: QUARRY_WORKER_CORPUS_INDEX, else corpus.db in the data directory)",
    )
    index = corpus_commands.add_parser(
        "index",
        parents=[index_file],
        help="add a folder of Markdown, HTML, text and PDF files, or re-index it (other folders stay)",
    )
    index.add_argument("folder", type=Path)
    index.add_argument(
        "--reembed", action="store_true", help="compute every document's vectors again (with an embedding model)"
    )
    corpus_commands.add_parser("list", parents=[index_file], help="the indexed folders, their documents and when")
    remove = corpus_commands.add_parser("remove", parents=[index_file], help="drop a folder and its documents")
    remove.add_argument("root", help="the folder, or its name as `quarry corpus list` shows it")
    search = corpus_commands.add_parser("search", parents=[index_file], help="search the corpus as the workers do")
    search.add_argument("query")
    search.add_argument("--limit", type=_positive, default=10, help="hits to show (default 10)")

    address_help = (
        "the supervisor's HOST:PORT (default: QUARRY_SUPERVISOR_ADDRESS, else where the quarry up running on the "
        "data directory serves, else 127.0.0.1:7410)"
    )
    ask = commands.add_parser("ask", parents=[data_dir], help="research a question and follow the run live")
    ask.add_argument("question")
    ask.add_argument("--address", help=address_help)
    ask.add_argument("--json", action="store_true", help="print one JSON object per event instead")
    ask.add_argument("--max-turns", type=int, default=0, help="bound on supervisor turns (default 12)")
    ask.add_argument(
        "--max-worker-turns",
        "--worker-max-turns",  # its first name, kept for scripts that use it
        dest="max_worker_turns",
        type=int,
        default=0,
        help="bound on each worker's turns (default 8)",
    )
    ask.add_argument("--parallel", type=int, default=0, help="delegations at once (default: the server's)")
    ask.add_argument("--max-tokens", type=int, default=0, help="token budget for the whole run (default: none)")
    ask.add_argument("--timeout", type=float, default=0, help="seconds the run may take (default: the server's)")
    ask.add_argument("--verification", choices=["on", "off"], help="verify the report (default: the server's)")
    ask.add_argument(
        "--require-approval",
        action="store_true",
        help="once verified, the run waits for `quarry runs approve` or `quarry runs reject`",
    )
    ask.add_argument(
        "--max-revision-rounds", type=int, default=0, help="rounds revising sentences objected to (default 2)"
    )

    runs = commands.add_parser("runs", help="list research runs, show one, approve or reject one")
    runs_commands = runs.add_subparsers(dest="runs_command", required=True)
    runs_list = runs_commands.add_parser("list", parents=[data_dir], help="the newest runs")
    runs_list.add_argument(
        "--state", choices=["queued", "running", "awaiting_approval", "succeeded", "failed", "cancelled"]
    )
    runs_list.add_argument("--limit", type=int, default=20)
    runs_list.add_argument("--json", action="store_true")
    runs_list.add_argument("--address", help=address_help)
    runs_show = runs_commands.add_parser("show", parents=[data_dir], help="one run: state, report, citations, usage")
    runs_show.add_argument("run_id")
    runs_show.add_argument("--json", action="store_true")
    runs_show.add_argument("--address", help=address_help)
    runs_approve = runs_commands.add_parser(
        "approve", parents=[data_dir], help="approve a run awaiting approval: it completes with its report"
    )
    runs_approve.add_argument("run_id")
    runs_approve.add_argument("--comment", default="", help="kept on the run's ledger as the approver's note")
    runs_approve.add_argument("--json", action="store_true")
    runs_approve.add_argument("--address", help=address_help)
    runs_reject = runs_commands.add_parser(
        "reject", parents=[data_dir], help="reject a run awaiting approval: it fails with the reason"
    )
    runs_reject.add_argument("run_id")
    runs_reject.add_argument("--reason", required=True, help="why: the run's error message")
    runs_reject.add_argument("--json", action="store_true")
    runs_reject.add_argument("--address", help=address_help)

    supervisor_address = argparse.ArgumentParser(add_help=False)
    supervisor_address.add_argument("--address", help=address_help)
    lab = commands.add_parser(
        "lab", help="campaigns: autonomous experiment loops over a code workspace (start, watch, ledger, plot...)"
    )
    _lab_arguments(lab, [data_dir, supervisor_address])

    migrate = commands.add_parser(
        "migrate",
        parents=[data_dir],
        help="upgrade each service's database schema, then exit (a Kubernetes Job before a rollout)",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    *others, last = (spec.name for spec, _ in databases())
    migrate.add_argument("services", nargs="*", help=f"{', '.join(others)} and/or {last} (default: all)")

    mesh = commands.add_parser("mesh", help="the credentials Quarry's services authenticate each other with")
    mesh_commands = mesh.add_subparsers(dest="mesh_command", required=True)
    keys = mesh_commands.add_parser(
        "keys", help="make a fresh token per role and print each service's mesh settings (`quarry up` needs none)"
    )
    keys.add_argument(
        "--format",
        choices=["env", "kubernetes"],
        default="env",
        help="env: QUARRY_MESH_* lines per service; kubernetes: the quarry-mesh Secret the manifests read",
    )

    doctor = commands.add_parser(
        "doctor",
        parents=[data_dir],
        help="ask each running service what it uses (model endpoint, search, database, peers) and how that works",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    doctor.add_argument("--address", help=address_help)
    return parser


def _lab_arguments(lab: argparse.ArgumentParser, parents: list[argparse.ArgumentParser]) -> None:
    """The `quarry lab` subcommands; `parents` give each the supervisor's address and the data directory."""
    commands = lab.add_subparsers(dest="lab_command", required=True)
    start = commands.add_parser("start", parents=parents, help="start a campaign from a TOML file and/or flags")
    start.add_argument("file", nargs="?", type=Path, help="the campaign file (TOML); flags override it")
    start.add_argument("--title")
    start.add_argument("--goal")
    start.add_argument("--constraint", action="append", help="a rule the changes must keep (repeatable)")
    start.add_argument("--editable", action="append", help="a path the campaign may edit (repeatable)")
    start.add_argument("--protected", action="append", help="a path it must never change (repeatable)")
    start.add_argument("--host", help="the monitor host the workspace is on (default: the monitor's machine)")
    start.add_argument("--root", help="the workspace: an absolute path to a git working tree")
    start.add_argument("--metric", help="the metric's name")
    start.add_argument("--direction", choices=["maximize", "minimize"])
    start.add_argument("--log-regex", help="a pattern with one group, the number, searched in the log")
    start.add_argument("--jsonl-path", help="or a JSON-lines file the experiment writes...")
    start.add_argument("--jsonl-key", help="...and the key of the number in it")
    # Not "command", which names the quarry command itself.
    start.add_argument(
        "--command", dest="experiment_command", help="the experiment's command line (never run by a shell)"
    )
    start.add_argument(
        "--slurm-script", help="or a batch script (relative to the workspace root) submitted through Slurm"
    )
    start.add_argument("--experiment-seconds", type=float, help="the wall-clock budget of one experiment")
    start.add_argument("--gpus", type=int, help="GPUs per experiment")
    start.add_argument("--max-tokens-per-hour", type=int)
    start.add_argument("--max-tokens", type=int)
    start.add_argument("--max-cycles-per-hour", type=int)
    start.add_argument("--max-cycles", type=int)
    start.add_argument("--stop-time", help="when to stop, with a zone: 2026-12-24T08:00:00Z")
    start.add_argument("--max-consecutive-failures", type=int, help="failed cycles in a row before pausing")
    start.add_argument("--baseline-runs", type=int, help="runs of the unchanged state per baseline (default 3)")
    start.add_argument("--phase-gate", type=float, help="the metric value whose clearing is reported")
    start.add_argument("--stop-at-gate", action="store_true", help="complete the campaign at the phase gate")
    start.add_argument("--request-id", default="", help="retry safely with the same id (default: a new one)")
    start.add_argument("--json", action="store_true", help="print the campaign as JSON")

    listing = commands.add_parser("list", parents=parents, help="the newest campaigns")
    listing.add_argument(
        "--state", choices=["queued", "running", "sleeping", "paused", "stopped", "completed", "failed"]
    )
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--json", action="store_true")
    show = commands.add_parser("show", parents=parents, help="one campaign: state, phase, best, budgets")
    show.add_argument("campaign_id")
    show.add_argument("--json", action="store_true")
    for verb, text in [("pause", "pause a campaign"), ("resume", "resume a paused one"), ("stop", "stop for good")]:
        command = commands.add_parser(verb, parents=parents, help=text)
        command.add_argument("campaign_id")
        command.add_argument("--reason", default="")
    direct = commands.add_parser("direct", parents=parents, help="a directive for the campaign's next THINK")
    direct.add_argument("campaign_id")
    direct.add_argument("text")
    direct.add_argument("--request-id", default="")
    ledger = commands.add_parser("ledger", parents=parents, help="the campaign's ledger, one row per cycle")
    ledger.add_argument("campaign_id")
    ledger.add_argument("--jsonl", action="store_true", help="one JSON object per row")
    watch = commands.add_parser("watch", parents=parents, help="follow a campaign live (Ctrl-C leaves it running)")
    watch.add_argument("campaign_id")
    plot = commands.add_parser("plot", parents=parents, help="a PNG of the metric over the experiments")
    plot.add_argument("campaign_id")
    plot.add_argument("-o", "--output", type=Path, help="the PNG to write (default: <campaign id>.png)")


def _serve(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli.serve import serve

    spec = SERVICES[args.service]
    settings = spec.load_settings(**({"address": args.address} if args.address else {}))
    return serve(spec, settings, common, port_file=args.port_file, parent_pid=args.parent_pid)


def _up(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.agent.model import ModelSettings
    from quarry.cli.launcher import Announcer, plan, run_mesh
    from quarry.config import ModelTier

    specs = list(SERVICES.values())
    overrides = {"address": "127.0.0.1:0"} if args.ephemeral_ports else {}
    models = []
    # Every service's settings, read now: a bad one is this command's error, before any service starts.
    for spec in specs:
        settings = spec.load_settings(**overrides)
        if isinstance(settings, ModelTier):
            model = ModelSettings.for_tier(settings, common)
            models.append((spec.name, model.model, model.base_url))
    return asyncio.run(
        run_mesh(
            plan(specs, workers=args.workers, data_dir=common.data_dir, ephemeral_ports=args.ephemeral_ports),
            data_dir=common.data_dir,
            ready_timeout=args.ready_timeout,
            stop_timeout=common.shutdown_grace_seconds + 5.0,
            announce=Announcer(data_dir=common.data_dir, models=models),
            policy=RestartPolicy(max_restarts=args.max_restarts),
        )
    )


def _corpus(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli.registry import SERVICES
    from quarry.config import WorkerSettings

    settings = load_settings(WorkerSettings)
    index = args.index or (Path(settings.corpus_index) if settings.corpus_index else common.data_dir / "corpus.db")
    return SERVICES["worker"].command("corpus")(args, index, settings, common)


def service_addresses(name: str, common: QuarrySettings, explicit: str | None = None) -> list[str]:
    """Where a client command finds a service: the address it was given, else the address set in the
    environment, else where the `quarry up` running on the data directory serves it, else the setting.

    Workers are where the supervisor calls them (maybe several).
    """
    from quarry.cli.mesh_state import MeshState
    from quarry.config import SupervisorSettings

    if explicit:
        return [explicit]
    if name == "worker":
        variable, configured = "QUARRY_SUPERVISOR_WORKER_ADDRESSES", load_settings(SupervisorSettings).worker_targets()
    else:
        spec = SERVICES[name]
        variable = f"{spec.settings_type().model_config.get('env_prefix', '')}ADDRESS"
        configured = [spec.load_settings().address]
    state = None if os.environ.get(variable) else MeshState.read(common.data_dir)
    return list(state.services.get(name) or configured) if state else configured


def _supervisor(args: argparse.Namespace, common: QuarrySettings) -> Supervisor:
    from quarry.cli.ask import Supervisor
    from quarry.clients.channels import open_channel
    from quarry.config import SupervisorSettings
    from quarry.security import ConnectionLimits, Tls

    settings = load_settings(SupervisorSettings)
    [address] = service_addresses("supervisor", common, args.address)
    tls, limits = Tls.from_settings(common), ConnectionLimits.from_settings(common)
    return Supervisor(address, lambda: open_channel(address, tls=tls, limits=limits, token=settings.auth_token))


def _ask(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli import ask
    from quarry.v1 import supervisor_pb2

    supervisor = _supervisor(args, common)
    options = supervisor_pb2.RunOptions(
        max_supervisor_turns=args.max_turns,
        max_worker_turns=args.max_worker_turns,
        max_parallel_delegations=args.parallel,
        max_tokens=args.max_tokens,
        verification=supervisor_pb2.VerificationMode.Value(f"VERIFICATION_MODE_{args.verification.upper()}")
        if args.verification
        else supervisor_pb2.VERIFICATION_MODE_UNSPECIFIED,
        require_approval=args.require_approval,
        max_revision_rounds=args.max_revision_rounds,
    )
    if args.timeout:
        options.timeout.FromNanoseconds(int(args.timeout * 1e9))
    return ask.run_client_command(ask.ask(supervisor, args.question, options, as_json=args.json))


def _runs(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli import ask

    supervisor = _supervisor(args, common)
    if args.runs_command == "list":
        return ask.run_client_command(ask.list_runs(supervisor, args.state or "", args.limit, as_json=args.json))
    if args.runs_command == "approve":
        return ask.run_client_command(
            ask.decide(supervisor, args.run_id, approve=True, note=args.comment, as_json=args.json)
        )
    if args.runs_command == "reject":
        return ask.run_client_command(
            ask.decide(supervisor, args.run_id, approve=False, note=args.reason, as_json=args.json)
        )
    return ask.run_client_command(ask.show_run(supervisor, args.run_id, as_json=args.json))


def _lab(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli import ask, lab

    return ask.run_client_command(lab.run(args, _supervisor(args, common)))


def _migrate(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.db import upgrade_schema

    known = {spec.name: (spec, migrations) for spec, migrations in databases()}
    unknown = sorted(set(args.services) - set(known))
    if unknown:
        print(f"quarry migrate: no database for {', '.join(unknown)}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    # Every database's settings first: a bad one stops the command before any schema changes.
    urls = {
        name: known[name][0].load_settings().resolved_database_url(common.data_dir) for name in args.services or known
    }
    for name, url in urls.items():
        _, migrations = known[name]
        try:
            upgrade_schema(url, migrations.scripts_path(), migrations.version_table_name())
        except (UnsupportedDatabase, SQLAlchemyError, OSError) as error:
            print(f"quarry migrate {name}: {error}", file=sys.stderr)
            return 1
        print(f"{name}: schema up to date")
    return 0


def _mesh(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli.mesh import as_environment, as_kubernetes_secret
    from quarry.mesh import MeshKeys

    keys = MeshKeys.generate()
    print(as_kubernetes_secret(keys) if args.format == "kubernetes" else as_environment(keys))
    return 0


def _doctor(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli.doctor import doctor

    explicit = {"supervisor": args.address}
    return doctor(common, {name: service_addresses(name, common, explicit.get(name)) for name in SERVICES})


HANDLERS: dict[str, Callable[[argparse.Namespace, QuarrySettings], int]] = {
    "serve": _serve,
    "up": _up,
    "corpus": _corpus,
    "ask": _ask,
    "runs": _runs,
    "lab": _lab,
    "migrate": _migrate,
    "mesh": _mesh,
    "doctor": _doctor,
}


def run(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run its command; a configuration error is one line and status 2."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "data_dir", None):
        # Through the environment: the settings read it, and so do the services `quarry up` starts.
        os.environ["QUARRY_DATA_DIR"] = str(args.data_dir.resolve())
    try:
        return HANDLERS[args.command](args, load_settings(QuarrySettings))
    except ConfigurationError as error:
        print(f"quarry: {error}", file=sys.stderr)
        return 2
