"""What `quarry up` tells its user: the services' table, restarts and stops, one plain line each for scripts."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from quarry.api_auth import API_KEY_FILE

if TYPE_CHECKING:
    from quarry.cli.restarts import RestartPolicy


class ServiceRow(NamedTuple):
    name: str
    address: str
    pid: int
    restarts: int


def describe_exit(status: int) -> str:
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-status).name}"
    return f"exited with status {status}"


class Announcer:
    """Prints what `quarry up` is doing; a class so tests and other front ends can replace it."""

    def __init__(self, data_dir: Path, models: Sequence[tuple[str, str, str, bool]] = ()) -> None:
        from rich.console import Console

        self._console = Console(highlight=False)
        self._data_dir = data_dir
        # (tier, model name, endpoint, whether any setting named them) for each tier that calls a model.
        self._models = models

    def _table(self, services: Sequence[ServiceRow]) -> None:
        from rich.table import Table

        table = Table(title="quarry is up", title_justify="left")
        table.add_column("service")
        table.add_column("address")
        table.add_column("pid", justify="right")
        table.add_column("restarts", justify="right")
        for name, address, pid, restarts in services:
            table.add_row(name, address, str(pid), str(restarts))
        self._console.print(table)

    def ready(self, services: Sequence[ServiceRow]) -> None:
        self._table(services)
        # One plain line per service, stable for scripts: "<name> <address>".
        for row in services:
            _line(f"serving {row.name} {row.address}")
        unset = [tier for tier, *_, configured in self._models if not configured]
        for tier, model, endpoint, configured in self._models:
            if configured:
                self._console.print(f"{tier} model: {model} at {endpoint}")
        if unset:
            self._console.print(
                f"[yellow]no model is configured[/yellow] for the {' and '.join(unset)}: runs fail until one is. "
                "Set QUARRY_MODEL_BASE_URL (an OpenAI-compatible endpoint ending in /v1: vLLM, Ollama, a hosted "
                "API) and QUARRY_MODEL_NAME, or [quarry] model_base_url and model_name in the config file; "
                "`quarry doctor` checks them."
            )
        self._console.print(f"data: {self._data_dir}")
        key = self._data_dir / API_KEY_FILE
        if key.exists():  # not under --open-api
            self._console.print(f"API key: {key} (quarry commands here send it; others: QUARRY_API_KEY)")
        self._console.print("Ctrl-C stops every service.")

    def restarting(self, name: str, why: str, delay: float, restart: int, policy: RestartPolicy) -> None:
        self._console.print(
            f"[yellow]{name} {why}[/yellow]; restarting it in {delay:g} s "
            f"(restart {restart} of at most {policy.max_restarts} in {policy.window_seconds:g} s)"
        )

    def restart_failed(self, reason: str) -> None:
        self._console.print(f"[yellow]restart failed:[/yellow] {reason}")

    def restarted(self, name: str, services: Sequence[ServiceRow]) -> None:
        self._table(services)
        row = next(row for row in services if row.name == name)
        _line(f"restarted {row.name} {row.address}")

    def stopping(self) -> None:
        self._console.print("stopping…")

    def stopped(self, name: str, status: int) -> None:
        _line(f"stopped {name}" + (f" ({describe_exit(status)})" if status else ""))

    def warning(self, message: str) -> None:
        self._console.print(f"[yellow]warning:[/yellow] {message}")

    def failed(self, reason: str) -> None:
        self._console.print(f"[red]quarry up failed:[/red] {reason}")


def _line(text: str) -> None:
    """One line for scripts, written whole in one write: the services' logs share the terminal, and under an
    unbuffered stdout print's separate newline could land after another process's bytes."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
