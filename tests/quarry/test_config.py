from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from quarry.cli import main
from quarry.config import (
    ConfigurationError,
    MonitorSettings,
    QuarrySettings,
    ScratchpadSettings,
    SupervisorSettings,
    WorkerSettings,
)
from quarry.credentials import credentials


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
        ("QUARRY_MODEL_API_KEY_FILE", "/nonexistent/key", "cannot read QUARRY_MODEL_API_KEY_FILE=/nonexistent/key"),
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


SECRETS = [
    (settings, name)
    for settings in (QuarrySettings, SupervisorSettings, WorkerSettings, ScratchpadSettings, MonitorSettings)
    for name in credentials(settings)
]


def secret_file(path: Path, contents: str, mode: int = 0o600) -> Path:
    path.write_text(contents)
    path.chmod(mode)
    return path


def test_the_credentials_are_marked_as_such() -> None:
    marked = {(settings.__name__, name) for settings, name in SECRETS}
    assert marked >= {
        ("QuarrySettings", "model_api_key"),
        ("QuarrySettings", "mesh_token"),
        ("SupervisorSettings", "auth_token"),
        ("SupervisorSettings", "model_api_key"),
        ("WorkerSettings", "search_api_key"),
        ("WorkerSettings", "embedding_api_key"),
        ("ScratchpadSettings", "database_url"),  # it may hold the database's password
    }
    assert ("QuarrySettings", "model_base_url") not in marked


@pytest.mark.parametrize(("settings", "name"), SECRETS, ids=lambda x: getattr(x, "__name__", x))
def test_each_credential_is_read_from_its_file_without_the_trailing_newline(
    settings: type[QuarrySettings], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variable = f"{settings.model_config.get('env_prefix', '')}{name.upper()}"
    monkeypatch.delenv(variable, raising=False)
    # Kubernetes mounts a Secret's file read-only (0400) behind a symlink.
    target = secret_file(tmp_path / "secret", "sqlite:///s3cret\n", 0o400)
    (tmp_path / "link").symlink_to(target)
    monkeypatch.setenv(f"{variable}_FILE", str(tmp_path / "link"))
    assert getattr(settings(), name) == "sqlite:///s3cret"


def test_only_one_trailing_newline_is_stripped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARRY_WORKER_SEARCH_API_KEY_FILE", str(secret_file(tmp_path / "key", "key\n\n")))
    assert WorkerSettings().search_api_key == "key\n"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_credential_file_others_may_read_is_refused(
    mode: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUARRY_MODEL_API_KEY_FILE", str(secret_file(tmp_path / "key", "sk", mode)))
    with pytest.raises(ConfigurationError, match=f"open to group or others \\(mode 0{mode:o}\\).*chmod 600"):
        QuarrySettings()


def test_a_credential_set_both_ways_or_whose_file_is_missing_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QUARRY_SUPERVISOR_AUTH_TOKEN_FILE", str(secret_file(tmp_path / "token", "t")))
    monkeypatch.setenv("QUARRY_SUPERVISOR_AUTH_TOKEN", "t")
    with pytest.raises(
        ConfigurationError, match="both QUARRY_SUPERVISOR_AUTH_TOKEN and QUARRY_SUPERVISOR_AUTH_TOKEN_FILE"
    ):
        SupervisorSettings()
    monkeypatch.delenv("QUARRY_SUPERVISOR_AUTH_TOKEN")
    monkeypatch.setenv("QUARRY_SUPERVISOR_AUTH_TOKEN_FILE", str(tmp_path / "missing"))
    assert main(["serve", "supervisor"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert (
        line
        == f"quarry: cannot read QUARRY_SUPERVISOR_AUTH_TOKEN_FILE={tmp_path / 'missing'}: No such file or directory"
    )
