"""The `quarry` command: one small handler per command (its arguments are `quarry.cli.arguments`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from quarry.cli.arguments import build_parser
from quarry.cli.registry import SERVICES, databases
from quarry.cli.settings import load_settings
from quarry.config import ConfigurationError, QuarrySettings

if TYPE_CHECKING:
    from quarry.cli.ask import Supervisor
    from quarry.v1 import supervisor_pb2


def _serve(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli.serve import serve

    spec = SERVICES[args.service]
    settings = spec.load_settings(**({"address": args.address} if args.address else {}))
    return serve(spec, settings, common, port_file=args.port_file, parent_pid=args.parent_pid)


def _up(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.agent.model import ModelSettings
    from quarry.cli.announcer import Announcer
    from quarry.cli.launcher import plan, run_process_group
    from quarry.cli.restarts import RestartPolicy
    from quarry.cli.up_api_key import supervisor_api_environment
    from quarry.config import ModelTier, MonitorSettings, SupervisorSettings
    from quarry.credentials import keep_private

    specs = list(SERVICES.values())
    overrides = {"address": "127.0.0.1:0"} if args.ephemeral_ports else {}
    models = []
    # Every service's settings, read now: a bad one is this command's error, before any service starts.
    for spec in specs:
        settings = spec.load_settings(**overrides)
        if isinstance(settings, ModelTier):
            model = ModelSettings.for_tier(settings, common)
            # Nothing set anywhere (the tier, [quarry], QUARRY_MODEL_*): the defaults name no real model.
            named = bool(settings.model_base_url or settings.model_name)
            configured = named or bool({"model_base_url", "model_name"} & common.model_fields_set)
            models.append((spec.name, model.model, model.base_url, configured))
    if args.open_api and load_settings(MonitorSettings).allow_job_submission:
        raise ConfigurationError(
            "--open-api is refused while the monitor allows job submission (QUARRY_MONITOR_ALLOW_JOB_SUBMISSION): "
            "anyone who reached the API could run commands"
        )
    # Its environment holds every service's credentials, its memory their mesh tokens: as private as theirs.
    keep_private()
    supervisor_env = supervisor_api_environment(
        common.data_dir, load_settings(SupervisorSettings), open_api=args.open_api
    )
    return asyncio.run(
        run_process_group(
            plan(specs, workers=args.workers, data_dir=common.data_dir, ephemeral_ports=args.ephemeral_ports),
            data_dir=common.data_dir,
            ready_timeout=args.ready_timeout,
            stop_timeout=common.shutdown_grace_seconds + 5.0,
            announce=Announcer(data_dir=common.data_dir, models=models),
            policy=RestartPolicy(max_restarts=args.max_restarts),
            service_env={"supervisor": supervisor_env},
        )
    )


def _corpus(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli.registry import SERVICES
    from quarry.config import WorkerSettings

    settings = load_settings(WorkerSettings)
    index = args.index or (Path(settings.corpus_index) if settings.corpus_index else common.data_dir / "corpus.db")
    return SERVICES["worker"].command("corpus")(args, index, settings, common)


def _papers(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli.registry import SERVICES
    from quarry.config import WorkerSettings

    return SERVICES["worker"].command("papers")(args, load_settings(WorkerSettings))


def service_addresses(name: str, common: QuarrySettings, explicit: str | None = None) -> list[str]:
    """Where a client command finds a service: the address it was given, else the address set in the
    environment, else where the `quarry up` running on the data directory serves it, else the setting.

    Workers are where the supervisor calls them (maybe several).
    """
    from quarry.cli.up_state import UpState
    from quarry.config import SupervisorSettings

    if explicit:
        return [explicit]
    if name == "worker":
        variable, configured = "QUARRY_SUPERVISOR_WORKER_ADDRESSES", load_settings(SupervisorSettings).worker_targets()
    else:
        spec = SERVICES[name]
        variable = f"{spec.settings_type().model_config.get('env_prefix', '')}ADDRESS"
        configured = [spec.load_settings().address]
    state = None if os.environ.get(variable) else UpState.read(common.data_dir)
    return list(state.services.get(name) or configured) if state else configured


def _supervisor(args: argparse.Namespace, common: QuarrySettings) -> Supervisor:
    from quarry.cli.ask import Supervisor
    from quarry.cli.credentials import api_credential
    from quarry.clients.channels import open_channel
    from quarry.config import SupervisorSettings
    from quarry.security import ConnectionLimits, Tls

    key = api_credential(common, load_settings(SupervisorSettings).auth_token).key
    [address] = service_addresses("supervisor", common, args.address)
    tls, limits = Tls.from_settings(common), ConnectionLimits.from_settings(common)
    return Supervisor(
        address,
        lambda: open_channel(address, tls=tls, limits=limits, token=key),
        find_again=lambda: _supervisor(args, common),
    )


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
        role_routes=[_role_route(role, tier) for role, tier in args.route],
    )
    if args.timeout:
        options.timeout.FromNanoseconds(int(args.timeout * 1e9))
    return ask.run_client_command(
        ask.ask(supervisor, args.question, options, as_json=args.json, wait_seconds=args.wait_for_supervisor)
    )


def _role_route(role: str, tier: str) -> supervisor_pb2.RoleRoute:
    """--route ROLE=TIER as the API has it; names it does not know reach the server unspecified, to be refused
    with the field named."""
    from quarry.v1 import common_pb2, supervisor_pb2

    roles, tiers = common_pb2.Role.keys(), common_pb2.ModelTier.keys()
    return supervisor_pb2.RoleRoute(
        role=common_pb2.Role.Value(f"ROLE_{role}") if f"ROLE_{role}" in roles else common_pb2.ROLE_UNSPECIFIED,
        tier=common_pb2.ModelTier.Value(f"MODEL_TIER_{tier}")
        if f"MODEL_TIER_{tier}" in tiers
        else common_pb2.MODEL_TIER_UNSPECIFIED,
    )


def _runs(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli import ask, runs

    if args.runs_command == "replay":  # no service: the replay brings its own mesh
        return SERVICES["supervisor"].command("replay")(args)
    supervisor = _supervisor(args, common)
    if args.runs_command == "export":
        return ask.run_client_command(runs.export_run(supervisor, args.run_id))
    if args.runs_command == "verify":
        return ask.run_client_command(runs.verify_run(supervisor, args.run_id))
    if args.runs_command == "watch":
        return ask.run_client_command(
            runs.watch_run(supervisor, args.run_id, as_json=args.json, wait_seconds=args.wait_for_supervisor)
        )
    if args.runs_command == "list":
        return ask.run_client_command(runs.list_runs(supervisor, args.state or "", args.limit, as_json=args.json))
    if args.runs_command == "approve":
        return ask.run_client_command(
            runs.decide(
                supervisor,
                args.run_id,
                approve=True,
                note=args.comment,
                as_json=args.json,
                over_objections=args.over_objections,
            )
        )
    if args.runs_command == "reject":
        return ask.run_client_command(
            runs.decide(supervisor, args.run_id, approve=False, note=args.reason, as_json=args.json)
        )
    return ask.run_client_command(runs.show_run(supervisor, args.run_id, as_json=args.json))


def _lab(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli import ask
    from quarry.cli.lab.commands import run as run_lab

    return ask.run_client_command(run_lab(args, _supervisor(args, common)))


def _migrate(args: argparse.Namespace, common: QuarrySettings) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from quarry.db import UnsupportedDatabase
    from quarry.migrations import upgrade_schema

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
    from quarry.cli.mesh_keys import as_environment, as_kubernetes_secret
    from quarry.mesh_auth import MeshKeys

    keys = MeshKeys.generate()
    print(as_kubernetes_secret(keys) if args.format == "kubernetes" else as_environment(keys))
    return 0


def _keys(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.config import SupervisorSettings

    return SERVICES["supervisor"].command("keys")(args, load_settings(SupervisorSettings), common)


def _doctor(args: argparse.Namespace, common: QuarrySettings) -> int:
    from quarry.cli.credentials import api_credential
    from quarry.cli.doctor import doctor
    from quarry.config import SupervisorSettings

    explicit = {"supervisor": args.address}
    credential = api_credential(common, load_settings(SupervisorSettings).auth_token)
    found = {name: service_addresses(name, common, explicit.get(name)) for name in SERVICES}
    return doctor(common, found, credential)


HANDLERS: dict[str, Callable[[argparse.Namespace, QuarrySettings], int]] = {
    "serve": _serve,
    "up": _up,
    "corpus": _corpus,
    "papers": _papers,
    "ask": _ask,
    "runs": _runs,
    "lab": _lab,
    "migrate": _migrate,
    "mesh": _mesh,
    "keys": _keys,
    "doctor": _doctor,
}


def run(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run its command; a configuration error is one line and status 2."""
    parser = build_parser()
    return run_parsed(parser, parser.parse_args(argv))


def run_parsed(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the command line's command, parsed; a configuration error is one line and status 2."""
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
