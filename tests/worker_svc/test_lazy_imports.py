"""A worker loads the libraries of paths it may never take when it takes them: numpy when it embeds,
trafilatura and pypdf where a page is extracted (the extraction processes), Alembic when it migrates.
Imported at start, they were 40 MiB of an idle worker's 138."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFERRED = ("numpy", "trafilatura", "pypdf", "lxml", "alembic")


def loaded_by_import(module: str) -> list[str]:
    """Which of DEFERRED a fresh interpreter holds after importing `module`."""
    code = f"import sys, {module}; print(' '.join(name for name in {DEFERRED!r} if name in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_worker_service_imports_none_of_the_deferred_libraries() -> None:
    assert loaded_by_import("worker_svc.service") == []


def test_a_page_is_extracted_in_a_process_that_had_not_loaded_the_extraction_libraries() -> None:
    # As `quarry corpus index` extracts, in its own process: the libraries come with the first page.
    code = (
        "import sys; from worker_svc.web.pages import extract; "
        "before = 'trafilatura' in sys.modules; "
        "title, text = extract('https://example.org/', 'text/html', "
        "b'<html><head><title>Kept</title></head><body><p>' + b'Readable text. ' * 20 + b'</p></body></html>'); "
        "print(before, title, text.split()[0])"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "Kept", "Readable"]
