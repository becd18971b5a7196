from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from quarry.cli import main
from quarry.config import ConfigurationError, QuarrySettings, ScratchpadSettings


def test_defaults_use_sqlite_under_the_data_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUARRY_SCRATCHPAD_DATABASE_URL", raising=False)
    settings = ScratchpadSettings()
    assert settings.max_content_bytes == 64 * 1024
    assert settings.resolved_database_url(tmp_path) == f"sqlite:///{tmp_path / 'scratchpad.db'}"


def test_environment_overrides_file_which_overrides_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "quarry.toml"
    config.write_text(
        '[quarry]\ndata_dir = "/srv/quarry"\n\n'
        '[scratchpad]\naddress = "0.0.0.0:9000"\nmax_content_bytes = 2048\n'
        'database_url = "postgresql://db/quarry"\n'
    )
    monkeypatch.setenv("QUARRY_CONFIG_FILE", str(config))
    monkeypatch.setenv("QUARRY_SCRATCHPAD_MAX_CONTENT_BYTES", "4096")
    settings = ScratchpadSettings()
    assert settings.address == "0.0.0.0:9000"
    assert settings.max_content_bytes == 4096
    assert settings.resolved_database_url(Path("/ignored")) == "postgresql://db/quarry"
    assert QuarrySettings().data_dir == Path("/srv/quarry")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("QUARRY_SCRATCHPAD_ADDRESS", "no-port"),
        ("QUARRY_SCRATCHPAD_ADDRESS", "host:99999"),
        ("QUARRY_SCRATCHPAD_MAX_CONTENT_BYTES", "0"),
        ("QUARRY_SCRATCHPAD_MAX_CONTENT_BYTES", "lots"),
    ],
)
def test_bad_values_are_rejected(variable: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError):
        ScratchpadSettings()


def test_unknown_key_in_the_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "quarry.toml"
    config.write_text("[scratchpad]\nmax_content_byte = 10\n")
    monkeypatch.setenv("QUARRY_CONFIG_FILE", str(config))
    with pytest.raises(ConfigurationError, match="max_content_byte"):
        ScratchpadSettings()


def test_unknown_table_in_the_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "quarry.toml"
    config.write_text('[quarry]\ndata_dir = "/srv/quarry"\n\n[wroker]\nsearch_backend = "brave"\n')
    monkeypatch.setenv("QUARRY_CONFIG_FILE", str(config))
    # Refused whichever settings are loaded, not only those of the table it was meant to be.
    with pytest.raises(ConfigurationError, match=r"unknown table\(s\) \[wroker\]; known: .*\[worker\]"):
        ScratchpadSettings()
    assert main(["corpus", "list"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "[wroker]" in line and "[monitor], [quarry], [scratchpad], [supervisor], [worker]" in line


@pytest.mark.parametrize(
    ("contents", "expected"),
    [(None, "cannot read"), ("[scratchpad\n", "not valid TOML"), ("scratchpad = 5\n", "must be a table")],
)
def test_unreadable_config_file_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, contents: str | None, expected: str
) -> None:
    config = tmp_path / "quarry.toml"
    if contents is not None:
        config.write_text(contents)
    monkeypatch.setenv("QUARRY_CONFIG_FILE", str(config))
    with pytest.raises(ConfigurationError, match=expected):
        ScratchpadSettings()


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("QUARRY_LOG_LEVEL", "verbose", "QUARRY_LOG_LEVEL"),
        ("QUARRY_SCRATCHPAD_MAX_CONTENT_BYTES", "lots", "QUARRY_SCRATCHPAD_MAX_CONTENT_BYTES"),
        ("QUARRY_CONFIG_FILE", "/nonexistent/quarry.toml", "cannot read"),
    ],
)
def test_cli_reports_bad_configuration_in_one_clear_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, value: str, named: str
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["serve", "scratchpad"]) == 2
    error = capsys.readouterr().err
    assert named in error
    assert "Traceback" not in error


def test_log_level_is_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARRY_LOG_LEVEL", "debug")
    assert QuarrySettings().log_level == "DEBUG"
