"""What a process loads at start is paid by every command and every service start: the command line and the
scratchpad leave out what only other paths use (each is a few hundred milliseconds on the CI machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def loaded_by_import(modules: str, watched: tuple[str, ...]) -> list[str]:
    """Which of `watched` a fresh interpreter holds after importing `modules`."""
    code = f"import sys, {modules}; print(' '.join(name for name in {watched!r} if name in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_scratchpad_and_the_command_line_load_no_http_client() -> None:
    # The HTTP stack is for the model and the web: the worker and the supervisor load it, the scratchpad not.
    assert loaded_by_import("quarry.cli.commands, scratchpad_svc.service", ("httpx", "httpcore")) == []


def test_commands_other_than_serve_load_no_grpc_server() -> None:
    assert loaded_by_import("quarry.cli.commands", ("quarry.server", "quarry.interceptors")) == []
