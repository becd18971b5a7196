"""The key `quarry up` keeps in its data directory, and what its supervisor is told."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from quarry.api_auth import ALL_ROLES, ApiPrincipal, api_key_digest, parse_api_keys, static_key_entry
from quarry.cli.commands import run
from quarry.cli.up_api_key import ensure_api_key, supervisor_api_environment
from quarry.config import ConfigurationError, SupervisorSettings
from quarry.identity import ApiRole


def test_the_key_is_made_once_readable_by_its_owner_only_and_kept_across_starts(tmp_path: Path) -> None:
    key = ensure_api_key(tmp_path / "data")
    path = tmp_path / "data" / "api-key"
    assert key.startswith("qk_") and path.read_text() == key + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_api_key(tmp_path / "data") == key
    path.write_text("")
    with pytest.raises(ConfigurationError, match="is empty"):
        ensure_api_key(tmp_path / "data")


def test_the_supervisor_accepts_the_local_key_beside_the_configured_ones(tmp_path: Path) -> None:
    configured = static_key_entry("ci", {ApiRole.RESEARCHER}, "qk_ci")
    env = supervisor_api_environment(tmp_path, SupervisorSettings(api_keys=configured), open_api=False)
    key = (tmp_path / "api-key").read_text().strip()
    assert parse_api_keys(env["QUARRY_SUPERVISOR_API_KEYS"]) == {
        api_key_digest("qk_ci"): ApiPrincipal("ci", frozenset({ApiRole.RESEARCHER})),
        api_key_digest(key): ApiPrincipal("local", ALL_ROLES),
    }
    assert key not in str(env)
    opened = supervisor_api_environment(tmp_path / "open", SupervisorSettings(), open_api=True)
    assert opened == {"QUARRY_SUPERVISOR_OPEN_API": "true", "QUARRY_SUPERVISOR_MONITOR_ADDRESS": ""}
    assert not (tmp_path / "open" / "api-key").exists()


def test_an_open_api_is_refused_while_the_monitor_submits_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QUARRY_MONITOR_ALLOW_JOB_SUBMISSION", "true")
    assert run(["up", "--open-api", "--data-dir", str(tmp_path)]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "--open-api is refused while the monitor allows job submission" in said
