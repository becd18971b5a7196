"""What `quarry up` runs and in which order, decided before any process starts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from quarry.cli.announcer import Announcer, ServiceRow
from quarry.cli.launcher import Child, Instance, plan, start_stages, stop_stages
from quarry.cli.registry import SERVICES
from quarry.cli.restarts import RestartPolicy


def names(stages: Sequence[Sequence[Instance | Child]]) -> list[set[str]]:
    return [{item.name for item in stage} for stage in stages]


def test_workers_are_numbered_each_with_its_own_id_and_address_over_one_database(tmp_path: Path) -> None:
    instances = {instance.name: instance for instance in plan(list(SERVICES.values()), workers=3, data_dir=tmp_path)}
    assert list(instances) == ["scratchpad", "monitor", "worker-1", "worker-2", "worker-3", "supervisor"]
    first, third = instances["worker-1"], instances["worker-3"]
    assert first.env == {"QUARRY_WORKER_ID": "worker-1"} and first.address is None
    # No database of its own: every worker uses the worker's usual file, so another can go on with a
    # delegation whose worker died.
    assert third.env == {"QUARRY_WORKER_ID": "worker-3"}
    assert third.address == "127.0.0.1:0", "beyond the first, a free port"


def test_a_configured_worker_database_is_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARRY_WORKER_DATABASE_URL", "postgresql://db/quarry")
    instances = plan(list(SERVICES.values()), workers=2, data_dir=tmp_path, ephemeral_ports=True)
    assert all("QUARRY_WORKER_DATABASE_URL" not in instance.env for instance in instances)
    assert {instance.address for instance in instances} == {"127.0.0.1:0"}


def test_services_start_after_what_they_call_and_stop_before_it(tmp_path: Path) -> None:
    instances = plan(list(SERVICES.values()), workers=2, data_dir=tmp_path)
    assert names(start_stages(instances)) == [{"scratchpad", "monitor"}, {"worker-1", "worker-2"}, {"supervisor"}]
    children = [Child(instance, tmp_path / instance.name, {}, None) for instance in instances]
    assert names(stop_stages(children)) == [{"supervisor"}, {"worker-1", "worker-2"}, {"scratchpad", "monitor"}]


def test_restart_backoff_doubles_from_half_a_second_up_to_its_cap() -> None:
    policy = RestartPolicy()
    assert [policy.delay(exits) for exits in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert (policy.max_restarts, policy.window_seconds) == (5, 600)


def test_up_says_plainly_when_no_model_is_configured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [ServiceRow("supervisor", "127.0.0.1:7410", 10, 0)]
    Announcer(tmp_path, [("supervisor", "default", "http://127.0.0.1:8000/v1", False)]).ready(rows)
    unset = " ".join(capsys.readouterr().out.split())
    assert "no model is configured for the supervisor: runs fail until one is" in unset
    assert "QUARRY_MODEL_BASE_URL" in unset and "127.0.0.1:8000" not in unset
    Announcer(tmp_path, [("worker", "qwen3", "http://gpu:8000/v1", True)]).ready(rows)
    named = capsys.readouterr().out
    assert "worker model: qwen3 at http://gpu:8000/v1" in named and "no model is configured" not in named
