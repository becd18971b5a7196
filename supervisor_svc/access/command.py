"""`quarry keys add|list|revoke`: the API keys in the supervisor's database, opened with the supervisor's own
settings (QUARRY_SUPERVISOR_DATABASE_URL, or its SQLite file in the data directory)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from quarry.api_auth import parse_roles
from quarry.config import QuarrySettings, SupervisorSettings
from quarry.db import SQLITE_WRITE, UnsupportedDatabase, create_engine
from quarry.migrations import upgrade_schema
from supervisor_svc.access.keys import KeyNameTaken, add_key, list_keys, revoke_key
from supervisor_svc.service import MIGRATIONS, VERSION_TABLE

_T = TypeVar("_T")


def run(args: argparse.Namespace, settings: SupervisorSettings, common: QuarrySettings) -> int:
    url = settings.resolved_database_url(common.data_dir)
    try:
        upgrade_schema(url, MIGRATIONS, VERSION_TABLE)  # as the supervisor would on start
        if args.keys_command == "add":
            return _add(url, args.name, args.principal or args.name, args.role)
        if args.keys_command == "list":
            return _list(url)
        return _revoke(url, args.name)
    except (UnsupportedDatabase, SQLAlchemyError, OSError) as error:
        print(f"quarry keys {args.keys_command}: {error}", file=sys.stderr)
        return 1


def _transaction(url: str, work: Callable[[Connection], _T]) -> _T:
    engine = create_engine(url, pool_size=1)
    try:
        # SQLite: take the write lock up front, beside a running supervisor.
        options = SQLITE_WRITE if engine.dialect.name == "sqlite" else {}
        with engine.connect().execution_options(**options) as connection, connection.begin():
            return work(connection)
    finally:
        engine.dispose()


def _add(url: str, name: str, principal: str, roles: list[str]) -> int:
    granted = parse_roles("+".join(roles), "--role")
    try:
        key = _transaction(url, lambda connection: add_key(connection, name, principal, granted))
    except KeyNameTaken as error:
        print(f"quarry keys add: {error}", file=sys.stderr)
        return 1
    print(f"# key {name}: principal {principal}, roles {'+'.join(sorted(granted))}", file=sys.stderr)
    print("# shown once, only here: give it to its holder (QUARRY_API_KEY), then forget it", file=sys.stderr)
    print(key)
    return 0


def _list(url: str) -> int:
    keys = _transaction(url, list_keys)
    print(f"{'NAME':24} {'PRINCIPAL':24} {'ROLES':40} {'CREATED':20} REVOKED")
    for key in keys:
        revoked = f"{key.revoke_time:%Y-%m-%d %H:%M:%S}" if key.revoke_time else "-"
        roles = "+".join(sorted(key.roles))
        print(f"{key.name:24} {key.principal:24} {roles:40} {key.create_time:%Y-%m-%d %H:%M:%S}  {revoked}")
    return 0


def _revoke(url: str, name: str) -> int:
    if not _transaction(url, lambda connection: revoke_key(connection, name)):
        print(f"quarry keys revoke: no key is named {name!r} (`quarry keys list` shows them)", file=sys.stderr)
        return 1
    print(f"revoked {name}: the supervisor refuses it within QUARRY_SUPERVISOR_API_KEY_REFRESH_SECONDS")
    return 0
