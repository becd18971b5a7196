"""Pins the kernel's public surface: a change to it must be a deliberate edit to public_api.toml too."""

from __future__ import annotations

import importlib
import tomllib
import types
from pathlib import Path

import quarry.errors

# One reviewed data file holds the expected names, so the pin is read as data rather than restated as code.
_PINNED = tomllib.loads((Path(__file__).parent / "public_api.toml").read_text(encoding="utf-8"))
PUBLIC_API: dict[types.ModuleType, set[str]] = {
    importlib.import_module(module_name): set(names) for module_name, names in _PINNED.items()
}


def test_pin_lists_each_name_once() -> None:
    for module_name, names in _PINNED.items():
        assert len(names) == len(set(names)), module_name


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
