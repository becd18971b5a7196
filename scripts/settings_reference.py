"""Prints the configuration reference (every setting, its variable, its default) as Markdown.

    python3 scripts/settings_reference.py > /tmp/reference.md

docs/operations.md embeds this output; a test keeps the two the same.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings

from quarry.config import (
    MonitorSettings,
    QuarrySettings,
    ScratchpadSettings,
    SupervisorSettings,
    WorkerSettings,
)

SECTIONS: list[tuple[str, type[BaseSettings]]] = [
    ("shared (`[quarry]`)", QuarrySettings),
    ("supervisor (`[supervisor]`)", SupervisorSettings),
    ("worker (`[worker]`)", WorkerSettings),
    ("scratchpad (`[scratchpad]`)", ScratchpadSettings),
    ("monitor (`[monitor]`)", MonitorSettings),
]


def _default(field: object) -> str:
    factory = getattr(field, "default_factory", None)
    value = factory() if factory is not None else getattr(field, "default", None)
    if value in ("", None, [], {}):
        return "(empty)"
    return f"`{value}`"


def reference() -> str:
    lines = []
    for title, settings in SECTIONS:
        prefix = settings.model_config.get("env_prefix", "")
        lines += [f"#### {title}", "", "| variable | default |", "| --- | --- |"]
        for name, field in settings.model_fields.items():
            default = "`$XDG_DATA_HOME/quarry` (`~/.local/share/quarry`)" if name == "data_dir" else _default(field)
            lines.append(f"| `{prefix}{name.upper()}` | {default} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference(), end="")
