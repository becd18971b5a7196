"""The kernel sits below the services and the command line: it imports neither. The command line
imports no service either: it starts services, and runs a service's own commands, by name.

Layers, bottom up: the kernel (`quarry`), the services (`*_svc`), the command line
(`quarry.cli`), which reaches the services only through the registry's lazy "module:attribute"
strings (quarry/cli/registry.py) and the public contracts (`quarry.v1`). `quarry/__main__.py` is
the command line's entry point, so it belongs to the top layer; `quarry/v1` is generated.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "quarry"
NOT_KERNEL = (KERNEL / "cli", KERNEL / "v1", KERNEL / "__main__.py")


GENERATED = KERNEL / "v1"


def _modules(excluded: tuple[Path, ...]) -> dict[str, Path]:
    modules = {}
    for path in sorted(KERNEL.rglob("*.py")):
        if any(path == skipped or skipped in path.parents for skipped in excluded):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def kernel_modules() -> dict[str, Path]:
    """Every kernel module by dotted name."""
    return _modules(NOT_KERNEL)


def quarry_modules() -> dict[str, Path]:
    """Every hand-written module of the `quarry` package by dotted name: the kernel and the command line."""
    return _modules((GENERATED,))


def is_service(module: str) -> bool:
    return module.split(".")[0].endswith("_svc")


def is_above_kernel(module: str) -> bool:
    return is_service(module) or module == "quarry.cli" or module.startswith("quarry.cli.")


def imported_modules(name: str, path: Path) -> set[str]:
    """What a module imports, anywhere in it (functions included), relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            imported.add(module)
            # `from quarry import cli` imports a module too.
            imported.update(f"{module}.{alias.name}" for alias in node.names)
    return imported


def layering_errors(modules: dict[str, Path], forbidden: Callable[[str], bool] = is_above_kernel) -> list[str]:
    return [
        f"{name} imports {target}"
        for name, path in modules.items()
        for target in sorted(imported_modules(name, path))
        if forbidden(target)
    ]


def test_the_kernel_is_found() -> None:
    modules = kernel_modules()
    assert {"quarry.server", "quarry.db", "quarry.config", "quarry.agent.loop"} <= set(modules)
    assert {"quarry.cli", "quarry.v1", "quarry.__main__"}.isdisjoint(".".join(name.split(".")[:2]) for name in modules)


def test_no_kernel_module_imports_a_service_or_the_command_line() -> None:
    assert layering_errors(kernel_modules()) == []


def test_the_command_line_imports_no_service_either() -> None:
    modules = quarry_modules()
    assert {"quarry.cli.lab.view", "quarry.cli.commands", "quarry.cli.registry", "quarry.__main__"} <= set(modules)
    assert layering_errors(modules, is_service) == []


def test_the_static_check_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "from quarry.config import QuarrySettings\n"
        "from quarry import cli\n"
        "def later() -> None:\n"
        "    import worker_svc.corpus\n"
        "    from .cli.registry import SERVICES\n"
        "    from scratchpad_svc import service\n"
    )
    assert layering_errors({"quarry.probe": module}) == [
        "quarry.probe imports quarry.cli",
        "quarry.probe imports quarry.cli.registry",
        "quarry.probe imports quarry.cli.registry.SERVICES",
        "quarry.probe imports scratchpad_svc",
        "quarry.probe imports scratchpad_svc.service",
        "quarry.probe imports worker_svc.corpus",
    ]


def _loaded_after_importing(modules: list[str]) -> list[str]:
    program = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    loaded: list[str] = json.loads(result.stdout.splitlines()[-1])
    return loaded


def test_importing_the_whole_kernel_loads_no_service_and_no_command_line() -> None:
    loaded = _loaded_after_importing(sorted(kernel_modules()))
    assert [name for name in loaded if is_above_kernel(name)] == []


def test_importing_the_whole_command_line_loads_no_service() -> None:
    # A `__main__` runs the command line when imported; those are checked statically above.
    modules = sorted(name for name in quarry_modules() if not name.endswith(".__main__"))
    assert [name for name in _loaded_after_importing(modules) if is_service(name)] == []
