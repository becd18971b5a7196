"""The `quarry` command's arguments: every subcommand, its flags and their help."""

from __future__ import annotations

import argparse
from datetime import date
from pathlib import Path

from quarry.cli.registry import SERVICES, databases
from quarry.cli.restarts import RestartPolicy
from quarry.identity import ApiRole

CONFIGURATION_HELP = """configuration:
  QUARRY_* environment variables (QUARRY_DATA_DIR, QUARRY_LOG_LEVEL,
  QUARRY_SCRATCHPAD_ADDRESS, QUARRY_SCRATCHPAD_DATABASE_URL, ...), or a TOML
  file named by QUARRY_CONFIG_FILE with a [quarry] table and one table per
  service ([scratchpad]); the environment wins. docs/settings.md lists every setting."""


RUN_ID = "the run's id, as `quarry ask` and `quarry runs list` show it"
CAMPAIGN_ID = "the campaign's id, as `quarry lab start` and `quarry lab list` show it"


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


def build_parser() -> argparse.ArgumentParser:
    """The `quarry` command's arguments, every subcommand's included."""
    # Every command but `serve` takes it: where the databases, the corpus and a running `quarry up`'s
    # addresses (mesh.json) are.
    data_dir = argparse.ArgumentParser(add_help=False)
    data_dir.add_argument(
        "--data-dir",
        type=Path,
        help="the data directory (default: QUARRY_DATA_DIR, else $XDG_DATA_HOME/quarry, else ~/.local/share/quarry)",
    )
    parser = argparse.ArgumentParser(
        prog="quarry",
        description="Quarry: deep research by a mesh of model-driven services.\n\n"
        'start here: `quarry up` in one terminal, then `quarry ask "your question"` in another;\n'
        "`quarry doctor` says what is missing or broken.",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command")

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
    up.add_argument(
        "--open-api",
        action="store_true",
        help="serve the public API without API keys (anyone who can reach it has every role); campaigns are off, "
        "and it is refused while the monitor allows job submission",
    )
    up.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for each service")
    up.add_argument(
        "--max-restarts",
        type=_not_negative,
        default=RestartPolicy.max_restarts,
        help=f"restarts of one service within {RestartPolicy.window_seconds:g} s before quarry up gives up and "
        f"stops (default {RestartPolicy.max_restarts})",
    )

    address_help = (
        "the supervisor's HOST:PORT (default: QUARRY_SUPERVISOR_ADDRESS, else where the quarry up running on the "
        "data directory serves, else 127.0.0.1:7410)"
    )
    # What the commands that follow a run share.
    following = argparse.ArgumentParser(add_help=False)
    following.add_argument("--json", action="store_true", help="print one JSON object per event instead")
    following.add_argument(
        "--wait-for-supervisor",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for a supervisor that went away mid-run before leaving the run to `quarry runs "
        "watch` (default 120)",
    )
    ask = commands.add_parser("ask", parents=[data_dir, following], help="research a question and follow the run live")
    ask.add_argument("question", help="the question to research, in quotes")
    ask.add_argument("--address", help=address_help)
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
    ask.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="ROLE=TIER",
        type=_role_route,
        help="run a delegated role on a model tier in this run, e.g. verifier=supervisor (repeatable; roles: "
        "researcher, verifier, citation_auditor, adjudicator, engineer; tiers: worker, supervisor)",
    )

    runs = commands.add_parser(
        "runs", help="list research runs, show one, approve or reject one, verify its ledger, export or replay one"
    )
    runs_commands = runs.add_subparsers(dest="runs_command", required=True)
    runs_list = runs_commands.add_parser("list", parents=[data_dir], help="the newest runs")
    runs_list.add_argument(
        "--state",
        choices=["queued", "running", "awaiting_approval", "succeeded", "failed", "cancelled"],
        help="only the runs in this state",
    )
    runs_list.add_argument("--limit", type=int, default=20, help="runs to show (default 20)")
    runs_list.add_argument("--json", action="store_true", help="print the runs as JSON")
    runs_list.add_argument("--address", help=address_help)
    runs_show = runs_commands.add_parser("show", parents=[data_dir], help="one run: state, report, citations, usage")
    runs_show.add_argument("run_id", help=RUN_ID)
    runs_show.add_argument("--json", action="store_true", help="print the run as JSON")
    runs_show.add_argument("--address", help=address_help)
    runs_watch = runs_commands.add_parser(
        "watch", parents=[data_dir, following], help="follow a run live to its end (Ctrl-C leaves it running)"
    )
    runs_watch.add_argument("run_id", help=RUN_ID)
    runs_watch.add_argument("--address", help=address_help)
    runs_approve = runs_commands.add_parser(
        "approve", parents=[data_dir], help="approve a run awaiting approval: it completes with its report"
    )
    runs_approve.add_argument("run_id", help=RUN_ID)
    runs_approve.add_argument("--comment", default="", help="kept on the run's ledger as the approver's note")
    runs_approve.add_argument(
        "--over-objections",
        action="store_true",
        help="approve although the review left objections open; needs --comment with the reason, and counts "
        "none of their sentences as supported",
    )
    runs_approve.add_argument("--json", action="store_true", help="print the run as JSON")
    runs_approve.add_argument("--address", help=address_help)
    runs_reject = runs_commands.add_parser(
        "reject", parents=[data_dir], help="reject a run awaiting approval: it fails with the reason"
    )
    runs_reject.add_argument("run_id", help=RUN_ID)
    runs_reject.add_argument("--reason", required=True, help="why: the run's error message")
    runs_reject.add_argument("--json", action="store_true", help="print the run as JSON")
    runs_reject.add_argument("--address", help=address_help)
    runs_export = runs_commands.add_parser(
        "export",
        parents=[data_dir],
        help="write an ended run's recording (a .qrun file) to standard output",
        description="Writes everything needed to replay an ended run: its question and options, its events, and "
        "every model call, search and fetched page its agents made, with their bodies by SHA-256. "
        "Example: quarry runs export RUN_ID > run.qrun",
    )
    runs_export.add_argument("run_id", help=RUN_ID)
    runs_export.add_argument("--address", help=address_help)
    runs_verify = runs_commands.add_parser(
        "verify",
        parents=[data_dir],
        help="fold a verified run's ledger again and check it is exactly the verification the run serves",
        description="Reads the run's research ledger (ListRunLedger), folds it as the supervisor does "
        "(quarry.records.fold), and compares the result with the run's verification (GetRun). Exits 0 when they "
        "are the same, 1 when they differ (each difference is listed), 2 when the run was not verified or has not "
        "finished its review.",
    )
    runs_verify.add_argument("run_id", help=RUN_ID)
    runs_verify.add_argument("--address", help=address_help)
    runs_replay = runs_commands.add_parser(
        "replay",
        help="re-execute a recorded run with no model and no network, and report where it first differs",
        description="Runs the recorded run again in a private mesh in this process, answering every model call, "
        "search and fetch from the recording, and compares its events, report and verification with the "
        "recorded ones. Exits 0 when the replay is exact, 1 at its first divergence (named by the recorded "
        "step, message or event), 2 when the file cannot be read.",
    )
    runs_replay.add_argument("file", help="a .qrun file written by `quarry runs export`")

    supervisor_address = argparse.ArgumentParser(add_help=False)

    supervisor_address.add_argument("--address", help=address_help)
    lab = commands.add_parser(
        "lab", help="campaigns: autonomous experiment loops over a code workspace (start, watch, ledger, plot...)"
    )
    _lab_arguments(lab, [data_dir, supervisor_address])

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
    index.add_argument("folder", type=Path, help="the folder to index, with everything below it")
    index.add_argument(
        "--reembed", action="store_true", help="compute every document's vectors again (with an embedding model)"
    )
    corpus_commands.add_parser("list", parents=[index_file], help="the indexed folders, their documents and when")
    remove = corpus_commands.add_parser("remove", parents=[index_file], help="drop a folder and its documents")
    remove.add_argument("root", help="the folder, or its name as `quarry corpus list` shows it")
    search = corpus_commands.add_parser("search", parents=[index_file], help="search the corpus as the workers do")
    search.add_argument("query", help="what to search for, in quotes")
    search.add_argument("--limit", type=_positive, default=10, help="hits to show (default 10)")

    papers = commands.add_parser(
        "papers", help="new papers, citations and venues from arXiv and Semantic Scholar, as the workers see them"
    )
    papers_commands = papers.add_subparsers(dest="papers_command", required=True)
    listing = argparse.ArgumentParser(add_help=False)
    listing.add_argument("--topic", help="what the papers should be about: ranks them by it")
    listing.add_argument("--limit", type=_positive, default=10, help="papers to show (default 10)")
    listing.add_argument("--json", action="store_true", help="print the papers as JSON")
    new = papers_commands.add_parser("new", parents=[listing], help="what arXiv received in some categories lately")
    new.add_argument("category", nargs="+", help="arXiv categories, such as cs.CL cs.LG")
    new.add_argument("--since", type=date.fromisoformat, help="first day, YYYY-MM-DD (default: the day before --until)")
    new.add_argument("--until", type=date.fromisoformat, help="last day, YYYY-MM-DD (default: today, UTC)")
    snowball = papers_commands.add_parser(
        "snowball", parents=[listing], help="a paper's references and the papers citing it (Semantic Scholar)"
    )
    snowball.add_argument("paper", help="an arXiv id or URL, a DOI, or a Semantic Scholar paper id")
    snowball.add_argument(
        "--direction",
        choices=("references", "citations", "both"),
        default="both",
        help="the papers it cites, the papers citing it, or both (default)",
    )
    venue = papers_commands.add_parser("venue", parents=[listing], help="a venue's papers of one year")
    venue.add_argument("venue", help="a conference or journal, such as NeurIPS or ACL")
    venue.add_argument("year", type=int, help="the year, such as 2024")

    doctor = commands.add_parser(
        "doctor",
        parents=[data_dir],
        help="ask each running service what it uses (model endpoint, search, database, peers) and how that works",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    doctor.add_argument("--address", help=address_help)

    api_keys = commands.add_parser(
        "keys", help="the API keys callers of the supervisor's public API present (in the supervisor's database)"
    )
    keys_commands = api_keys.add_subparsers(dest="keys_command", required=True)
    roles = ", ".join(role.value for role in ApiRole)
    add = keys_commands.add_parser(
        "add", parents=[data_dir], help="make a key and print it, once (only its digest is stored)"
    )
    add.add_argument("name", help="the key's name, unique (revoke it by this name)")
    add.add_argument(
        "--role",
        action="append",
        required=True,
        choices=[role.value for role in ApiRole],
        help=f"a role the key holds; repeat for several ({roles}; every role also reads; operator runs code "
        "on the monitor's host through campaigns)",
    )
    add.add_argument("--principal", help="who the key speaks for (default: its name); several keys may share one")
    keys_commands.add_parser("list", parents=[data_dir], help="every key: name, principal, roles, when (never the key)")
    revoke = keys_commands.add_parser("revoke", parents=[data_dir], help="revoke a key by name")
    revoke.add_argument("name", help="the key's name, as `quarry keys add` gave it")

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

    migrate = commands.add_parser(
        "migrate",
        parents=[data_dir],
        help="upgrade each service's database schema, then exit (a Kubernetes Job before a rollout)",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    *others, last = (spec.name for spec, _ in databases())
    migrate.add_argument("services", nargs="*", help=f"{', '.join(others)} and/or {last} (default: all)")

    serve = commands.add_parser(
        "serve",
        help="run one service in the foreground",
        epilog=CONFIGURATION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("service", choices=sorted(SERVICES), help="which service to run")
    serve.add_argument("--address", help="HOST:PORT to listen on (port 0 picks a free one)")
    serve.add_argument("--port-file", type=Path, help="write the bound HOST:PORT here once serving")
    # Set by `quarry up`: stop when that process dies, however it dies.
    serve.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    return parser


def _role_route(text: str) -> tuple[str, str]:
    role, equals, tier = text.partition("=")
    if not equals or not role.strip() or not tier.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not ROLE=TIER (e.g. verifier=supervisor)")
    return role.strip().upper(), tier.strip().upper()


def _lab_arguments(lab: argparse.ArgumentParser, parents: list[argparse.ArgumentParser]) -> None:
    """The `quarry lab` subcommands; `parents` give each the supervisor's address and the data directory."""
    commands = lab.add_subparsers(dest="lab_command", required=True)
    start = commands.add_parser("start", parents=parents, help="start a campaign from a TOML file and/or flags")
    start.add_argument("file", nargs="?", type=Path, help="the campaign file (TOML); flags override it")
    start.add_argument("--title", help="a short name for the campaign (TOML: title)")
    start.add_argument("--goal", help="what the campaign is after, for its leader (TOML: brief.goal)")
    start.add_argument("--constraint", action="append", help="a rule the changes must keep (repeatable)")
    start.add_argument("--editable", action="append", help="a path the campaign may edit (repeatable)")
    start.add_argument("--protected", action="append", help="a path it must never change (repeatable)")
    start.add_argument("--host", help="the monitor host the workspace is on (default: the monitor's machine)")
    start.add_argument("--root", help="the workspace: an absolute path to a git working tree")
    start.add_argument("--metric", help="the metric's name")
    start.add_argument(
        "--direction",
        choices=["maximize", "minimize"],
        help="whether a larger or a smaller metric is better (TOML: metric.direction)",
    )
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
    start.add_argument(
        "--isolate-network", action="store_true", help="run each experiment without a network (a local job only)"
    )
    start.add_argument(
        "--max-tokens-per-hour",
        type=int,
        help="model tokens it may spend in any hour (TOML: budgets.max_tokens_per_hour)",
    )
    start.add_argument("--max-tokens", type=int, help="model tokens it may spend in all (TOML: budgets.max_tokens)")
    start.add_argument(
        "--max-cycles-per-hour", type=int, help="cycles it may run in any hour (TOML: budgets.max_cycles_per_hour)"
    )
    start.add_argument("--max-cycles", type=int, help="cycles it may run in all (TOML: budgets.max_cycles)")
    start.add_argument("--stop-time", help="when to stop, with a zone: 2026-12-24T08:00:00Z")
    start.add_argument("--max-consecutive-failures", type=int, help="failed cycles in a row before pausing")
    start.add_argument(
        "--baseline-runs", type=int, help="runs of the unchanged state per baseline, at least 2 (default 3)"
    )
    start.add_argument("--phase-gate", type=float, help="the metric value whose clearing is reported")
    start.add_argument("--stop-at-gate", action="store_true", help="complete the campaign at the phase gate")
    start.add_argument(
        "--report-at-end", action="store_true", help="have the writer write the report before the campaign completes"
    )
    start.add_argument("--request-id", default="", help="retry safely with the same id (default: a new one)")
    start.add_argument("--json", action="store_true", help="print the campaign as JSON")

    listing = commands.add_parser("list", parents=parents, help="the newest campaigns")
    listing.add_argument(
        "--state",
        choices=["queued", "running", "sleeping", "paused", "stopped", "completed", "failed"],
        help="only the campaigns in this state",
    )
    listing.add_argument("--limit", type=int, default=20, help="campaigns to show (default 20)")
    listing.add_argument("--json", action="store_true", help="print the campaigns as JSON")
    show = commands.add_parser("show", parents=parents, help="one campaign: state, phase, best, budgets")
    show.add_argument("campaign_id", help=CAMPAIGN_ID)
    show.add_argument("--json", action="store_true", help="print the campaign as JSON")
    for verb, text in [("pause", "pause a campaign"), ("resume", "resume a paused one"), ("stop", "stop for good")]:
        command = commands.add_parser(verb, parents=parents, help=text)
        command.add_argument("campaign_id", help=CAMPAIGN_ID)
        command.add_argument("--reason", default="", help="why, for the campaign's record")
    direct = commands.add_parser("direct", parents=parents, help="a directive for the campaign's next THINK")
    direct.add_argument("campaign_id", help=CAMPAIGN_ID)
    direct.add_argument("text", help="the directive, in quotes: the next THINK reads it once")
    direct.add_argument("--request-id", default="", help="retry safely with the same id (default: a new one)")
    ledger = commands.add_parser("ledger", parents=parents, help="the campaign's ledger, one row per cycle")
    ledger.add_argument("campaign_id", help=CAMPAIGN_ID)
    ledger.add_argument("--jsonl", action="store_true", help="one JSON object per row")
    watch = commands.add_parser("watch", parents=parents, help="follow a campaign live (Ctrl-C leaves it running)")
    watch.add_argument("campaign_id", help=CAMPAIGN_ID)
    report = commands.add_parser(
        "report", parents=parents, help="the campaign's written report (Markdown, or HTML with -o report.html)"
    )
    report.add_argument("campaign_id", help=CAMPAIGN_ID)
    report.add_argument(
        "-o",
        "--output",
        type=Path,
        help="write it here: .html is self-contained; .md gets its plot as a .svg beside it",
    )
    report.add_argument("--new", action="store_true", help="have the writer write a new one from the ledger now")
    report.add_argument("--request-id", default="", help="retry a --new safely with the same id")
    plot = commands.add_parser("plot", parents=parents, help="a PNG of the metric over the experiments")
    plot.add_argument("campaign_id", help=CAMPAIGN_ID)
    plot.add_argument("-o", "--output", type=Path, help="the PNG to write (default: <campaign id>.png)")
