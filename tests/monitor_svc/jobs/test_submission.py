"""The checks every submission shares (monitor_svc/jobs/submission.py): a bad request names its field and
starts nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from quarry.v1 import monitor_pb2
from tests.monitor_svc.jobs.helpers import Stub
from tests.rpc import expect_error, violations


def _options(**fields: Any) -> monitor_pb2.JobOptions:
    return monitor_pb2.JobOptions(**fields)


def _metric(**fields: Any) -> monitor_pb2.JobOptions:
    spec: dict[str, Any] = {"name": "loss", "direction": monitor_pb2.METRIC_DIRECTION_MINIMIZE}
    spec.update(fields)
    return _options(metrics=[monitor_pb2.MetricSpec(**spec)])


BAD: list[tuple[str, dict[str, Any], monitor_pb2.JobOptions, str]] = [
    ("an unclosed quote", {"command_line": "echo 'oops"}, _options(), "local.command_line"),
    ("argv and a command line", {"argv": ["true"], "command_line": "true"}, _options(), "local.command_line"),
    ("a pattern that is not one", {}, _metric(log_regex="loss=(["), "options.metrics[0].log_regex"),
    ("a pattern without a group", {}, _metric(log_regex="loss=[0-9.]+"), "options.metrics[0].log_regex"),
    ("a pattern with two groups", {}, _metric(log_regex="(a)=(b)"), "options.metrics[0].log_regex"),
    ("a backtracking pattern", {}, _metric(log_regex="(a+)\\1"), "options.metrics[0].log_regex"),
    ("no direction", {}, _metric(direction=0, log_regex="l=(.*)"), "options.metrics[0].direction"),
    ("no source", {}, _metric(), "options.metrics[0].log_regex"),
    ("a bad name", {}, _metric(name="a b", log_regex="l=(.*)"), "options.metrics[0].name"),
    (
        "a file outside",
        {},
        _metric(jsonl_file=monitor_pb2.JsonlMetric(path="../m.jsonl", key="k")),
        "options.metrics[0].jsonl_file.path",
    ),
    (
        "a file without a working directory",
        {"working_directory": ""},
        _metric(jsonl_file=monitor_pb2.JsonlMetric(path="m.jsonl", key="k")),
        "options.metrics[0].jsonl_file.path",
    ),
    ("a bad variable name", {}, _options(environment={"A-B": "1"}), "options.environment"),
    ("a NUL in a value", {}, _options(environment={"A": "1\x00"}), "options.environment"),
    ("no time at all", {}, _options(wall_clock_limit={"seconds": 0}), "options.wall_clock_limit"),
    (
        "a count and indices",
        {},
        _options(gpus=monitor_pb2.GpuRequest(count=1, indices=[0])),
        "options.gpus.indices",
    ),
    (
        "CUDA_VISIBLE_DEVICES with a GPU request",
        {},
        _options(gpus=monitor_pb2.GpuRequest(count=1), environment={"CUDA_VISIBLE_DEVICES": "0"}),
        "options.environment",
    ),
    ("a workspace id that is not one", {}, _options(workspace_id="ws-1"), "options.workspace_id"),
]


@pytest.mark.parametrize(("case", "command", "options", "field"), BAD, ids=[case[0] for case in BAD])
async def test_a_bad_experiment_request_names_its_field_and_starts_nothing(
    monitor: Stub, tmp_path: Path, case: str, command: dict[str, Any], options: monitor_pb2.JobOptions, field: str
) -> None:
    fields: dict[str, Any] = {"argv": ["touch", str(tmp_path / "started")], "working_directory": str(tmp_path)}
    fields.update(command)
    if "command_line" in command and "argv" not in command:
        del fields["argv"]
    request = monitor_pb2.SubmitJobRequest(local=monitor_pb2.LocalCommand(**fields), request_id="bad", options=options)
    error = await expect_error(monitor.SubmitJob(request), grpc.StatusCode.INVALID_ARGUMENT)
    assert field in violations(error), violations(error)
    assert not (tmp_path / "started").exists()
