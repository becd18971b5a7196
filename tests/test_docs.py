"""The documentation is the project's own: every file it names is in the repository, it points at
nothing outside it, and the settings reference is what the settings classes say."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

from pydantic import BaseModel

from quarry.config import SshHost

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A path in backquotes, e.g. `quarry/server.py` or `protos/baseline/`.
_PATH = re.compile(r"`(\.{0,2}/?[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+/?)`")
# The target of a Markdown link that is not a URL.
_LINK = re.compile(r"\]\((?![a-z]+:)([^)#\s]+)")
_GENERATOR = runpy.run_path(str(ROOT / "scripts" / "gen_settings_doc.py"))


def named_paths(text: str) -> list[str]:
    """The paths a document names that start at the top of this repository (or climb out of it)."""
    tops = {entry.name for entry in ROOT.iterdir()}
    return [path for path in _PATH.findall(text) if path.startswith(("../", "/")) or path.split("/")[0] in tops]


def test_every_file_the_docs_name_is_in_the_repository() -> None:
    missing = [
        f"{document.name}: {path}"
        for document in DOCUMENTS
        for path in named_paths(document.read_text(encoding="utf-8"))
        if path.startswith(("../", "/")) or not (ROOT / path).exists()
    ]
    assert missing == []


def test_every_link_in_the_docs_leads_to_a_file_in_the_repository() -> None:
    broken = [
        f"{document.name}: {target}"
        for document in DOCUMENTS
        for target in _LINK.findall(document.read_text(encoding="utf-8"))
        if not (document.parent / target).resolve().is_relative_to(ROOT) or not (document.parent / target).exists()
    ]
    assert broken == []


def test_the_path_check_sees_a_missing_file_and_a_path_outside() -> None:
    text = "`quarry/server.py`, `quarry/nowhere.py`, `../shared/DESIGN.md`, `nvidia.com/gpu`, `google/api/x.proto`"
    assert named_paths(text) == ["quarry/server.py", "quarry/nowhere.py", "../shared/DESIGN.md"]


def test_no_document_refers_to_design_notes_kept_outside_the_repository() -> None:
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        assert "DESIGN.md" not in text and "../shared" not in text, document.name


def test_the_settings_reference_is_current() -> None:
    committed = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert committed == _GENERATOR["reference"](), "run python3 scripts/gen_settings_doc.py"


def test_every_setting_says_what_it_means() -> None:
    models: list[type[BaseModel]] = [model for _, model in _GENERATOR["SECTIONS"]] + [SshHost]
    undocumented = [
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if not field.description
    ]
    assert undocumented == []


# Packages whose modules the architecture's module table describes one by one.
_PACKAGES = ("quarry", "scratchpad_svc", "worker_svc", "supervisor_svc", "monitor_svc")


def hand_written_modules() -> list[str]:
    """Every module a person wrote: generated stubs, migrations and package boilerplate aside."""
    modules = []
    for package in _PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if {"v1", "migrations"} & set(relative.parts) or path.name in {"__init__.py", "__main__.py"}:
                continue
            modules.append(relative.as_posix())
    return modules


def module_table(text: str) -> str:
    """The rows of the table under '## Modules'."""
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("| `"))


def test_the_module_table_names_every_hand_written_module() -> None:
    """Each module is named by its full path in the first column of a row (a row may name several)."""
    table = module_table((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    named = set(re.findall(r"`([^`]+\.py)`", "\n".join(row.split(" | ", 1)[0] for row in table.splitlines())))
    assert [module for module in hand_written_modules() if module not in named] == []


def test_the_benchmarks_doc_states_figures_that_bench_all_reruns() -> None:
    """Every bench bench/all.py reruns is documented with its command, and every figure the document
    states belongs to one of them, so that a reader can reproduce each figure."""
    rerun = runpy.run_path(str(ROOT / "bench" / "all.py"))
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    benches: dict[str, list[str]] = rerun["BENCHES"]
    undocumented = [name for name, command in benches.items() if f"python3 {' '.join(command)}" not in text]
    figures = rerun["documented"](text)
    strays = [key for key in figures if key.split("/")[0] not in benches]
    assert undocumented == []
    assert len(figures) >= len(benches)
    assert strays == []


_MESSAGE = re.compile(r"^> message: `([^`]+)`$", re.MULTILINE)


def test_every_message_the_troubleshooting_page_quotes_is_still_said_by_the_code() -> None:
    quoted = _MESSAGE.findall((ROOT / "docs" / "troubleshooting.md").read_text())
    assert len(quoted) >= 12, "the page quotes its messages as `> message: ...` lines"
    sources = [
        path.read_text()
        for package in (*_PACKAGES, "tests")
        for path in (ROOT / package).rglob("*.py")
        if path != Path(__file__)
    ]
    missing = [message for message in quoted if not any(message in source for source in sources)]
    assert missing == []
