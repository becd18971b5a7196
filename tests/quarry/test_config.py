from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from quarry.config import QuarrySettings, ScratchpadSettings


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
