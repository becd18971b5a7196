"""The service registry is the one list of services: everything it names exists and agrees."""

from __future__ import annotations

import inspect
from pathlib import Path

from quarry.cli.registry import SERVICES, databases, resolve
from quarry.config import ServiceSettings

ROOT = Path(__file__).resolve().parents[3]


def package_of(name: str) -> str:
    return SERVICES[name].builder.partition(".")[0]


def test_every_service_package_is_registered() -> None:
    packages = {path.parent.name for path in ROOT.glob("*_svc/__init__.py")}
    assert packages == {package_of(name) for name in SERVICES}


def test_every_target_resolves() -> None:
    for spec in SERVICES.values():
        assert issubclass(spec.settings_type(), ServiceSettings), spec.name
        assert inspect.iscoroutinefunction(resolve(spec.builder)), spec.name


def test_services_are_listed_after_the_services_they_need() -> None:
    order = list(SERVICES)
    for name, spec in SERVICES.items():
        for needed in spec.needs:
            assert order.index(needed) < order.index(name), (name, needed)


def test_each_database_has_its_own_migrations_and_version_table() -> None:
    tables = []
    for spec, migrations in databases():
        scripts = migrations.scripts_path()
        assert scripts.resolve() == ROOT / package_of(spec.name) / "migrations", spec.name
        assert (scripts / "env.py").exists() and any((scripts / "versions").glob("*.py")), spec.name
        tables.append(migrations.version_table_name())
    assert [spec.name for spec, _ in databases()] == ["scratchpad", "worker", "supervisor"]
    assert len(set(tables)) == len(tables)


def test_each_service_runs_as_its_package() -> None:
    for name in SERVICES:
        main = ROOT / package_of(name) / "__main__.py"
        assert f'serve_main("{name}")' in main.read_text(), main
