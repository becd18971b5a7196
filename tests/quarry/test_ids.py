"""Every id shape, defined once, and its checks."""

from __future__ import annotations

import pytest

from quarry import ids
from quarry.errors import FieldViolation, InvalidArgument


def test_request_ids_fit_the_narrowest_column() -> None:
    assert ids.REQUEST_ID.matches("run:call_abc") and ids.REQUEST_ID.matches("x" * 128)
    assert not ids.REQUEST_ID.matches("x" * 129)
    assert not ids.REQUEST_ID.matches("has space")


def test_thread_run_and_label_shapes() -> None:
    assert ids.THREAD_ID.matches("t-1") and not ids.THREAD_ID.matches("-t") and not ids.THREAD_ID.matches("T1")
    assert not ids.THREAD_ID.matches("a" * 64)
    assert ids.RUN_ID.matches(ids.new_run_id()) and not ids.RUN_ID.matches("run-1")
    assert ids.LABEL_KEY.matches("team.name") and not ids.LABEL_KEY.matches("1team")
    assert ids.DELEGATION_ID.matches("d" * 256) and not ids.DELEGATION_ID.matches("d" * 257)
    assert ids.new_conversation_id().startswith("conv-")


def test_check_reports_missing_and_malformed_values() -> None:
    assert ids.THREAD_ID.check("thread_id", "") == FieldViolation("thread_id", "required")
    assert ids.REQUEST_ID.check("request_id", "", when_missing=None) is None
    assert ids.REQUEST_ID.check("request_id", "", when_missing="required: why") == FieldViolation(
        "request_id", "required: why"
    )
    violation = ids.REQUEST_ID.check("request_id", "a b")
    assert violation is not None and violation.description == (
        "must be 1-128 printable ASCII characters without spaces"
    )
    assert ids.THREAD_ID.check("thread_id", "t-1") is None


def test_violations_keeps_only_the_problems_and_require_raises() -> None:
    found = ids.violations(ids.THREAD_ID.check("a", "ok"), ids.THREAD_ID.check("b", ""))
    assert found == [FieldViolation("b", "required")]
    with pytest.raises(InvalidArgument) as raised:
        ids.RUN_ID.require("run_id", "run-1")
    assert raised.value.violations[0].field == "run_id"
