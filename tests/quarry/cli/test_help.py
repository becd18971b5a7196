"""`quarry --help` leads a new user: where to start, the user's commands first, every argument explained."""

from __future__ import annotations

import argparse

import pytest

from quarry.cli import main
from quarry.cli.arguments import build_parser


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every subcommand's, however deep."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found.extend(_parsers(child))
    return found


def test_help_opens_with_where_to_start_and_lists_serve_last(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert 'start here: `quarry up` in one terminal, then `quarry ask "your question"` in another;' in out
    listed = next(line for line in out.splitlines() if line.strip().startswith("{up,"))
    commands = listed.strip().strip("{}").split(",")
    assert commands[:2] == ["up", "ask"] and commands[-1] == "serve"


def test_every_command_and_argument_has_help() -> None:
    missing = [
        f"{parser.prog}: {action.dest}"
        for parser in _parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []
    commands = [
        f"{parser.prog} {name}"
        for parser in _parsers(build_parser())
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
        if not any(choice.dest == name and choice.help for choice in action._choices_actions)
    ]
    assert commands == []
