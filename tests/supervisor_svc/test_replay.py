"""Exact replay: the recorded fixtures (tests/replays/*.qrun) re-execute with no model and no network, and a
deliberate change is reported at the first step it changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quarry.replay import qrun
from supervisor_svc.replay import replay
from supervisor_svc.runs import run as run_module

FIXTURES = Path(__file__).parents[1] / "replays"
RERECORD = "if the change is meant, record the fixtures again: python3 -m tests.replays.record"


@pytest.mark.parametrize("name", ["plain", "verified_with_objections", "failed_delegation"])
async def test_every_recorded_fixture_replays_exactly(name: str, tmp_path: Path) -> None:
    recording = qrun.read(str(FIXTURES / f"{name}.qrun"))

    outcome = await replay(recording, tmp_path)

    assert outcome.divergence is None, f"{outcome.divergence}; {RERECORD}"
    assert outcome.unasked == []
    assert outcome.run["state"] == "RUN_STATE_SUCCEEDED"
    assert outcome.run["report"] == recording.run["report"]
    assert len(outcome.events) == len(recording.events)
    assert outcome.run.get("verification") == recording.run.get("verification")


async def test_the_fixtures_cover_a_plain_run_a_verified_run_with_objections_and_a_failed_delegation() -> None:
    plain, verified, failed = (
        qrun.read(str(FIXTURES / f"{name}.qrun")) for name in ("plain", "verified_with_objections", "failed_delegation")
    )
    assert "verification" not in plain.run and plain.run["report"]["citations"]
    objections = verified.run["verification"]["objections"]
    assert len(objections) >= 2 and all(o["status"] != "OBJECTION_STATUS_OPEN" for o in objections)
    phases = [event["status"]["phase"] for event in failed.events if "status" in event]
    assert "RESEARCH_PHASE_WORKER_FAILED" in phases and "RESEARCH_PHASE_WORKER_COMPLETED" in phases
    # Fetched pages are in the recordings with their bodies.
    pages = [e for e in plain.exchanges if e.url.endswith("/history.html")]
    assert pages and b"May 1889" in plain.blob(pages[0].body_sha256)


async def test_a_changed_prompt_is_reported_as_the_first_divergence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recording = qrun.read(str(FIXTURES / "plain.qrun"))
    monkeypatch.setattr(run_module, "INSTRUCTIONS", run_module.INSTRUCTIONS.replace("bounded", "small"))

    outcome = await replay(recording, tmp_path)

    assert outcome.divergence is not None
    assert outcome.divergence.startswith("step 1 (supervisor): model call: message 1 (system) differs"), (
        outcome.divergence
    )
    assert "Split it into bounded" in outcome.divergence and "Split it into small" in outcome.divergence
    assert outcome.run["state"] == "RUN_STATE_FAILED"  # its model call was refused: nothing made up


def test_a_file_that_is_not_a_recording_is_refused_with_where_and_why(tmp_path: Path) -> None:
    lines = (FIXTURES / "plain.qrun").read_bytes().splitlines(keepends=True)
    header = json.loads(lines[0])
    with pytest.raises(qrun.RecordingError, match="format version 2 is not known"):
        qrun.parse([json.dumps({**header, "version": 2}).encode(), *lines[1:]])
    blob = next(n for n, text in enumerate(lines) if text.startswith(b'{"record":"blob"'))
    tampered = json.loads(lines[blob])
    tampered["text"] = "changed"
    with pytest.raises(qrun.RecordingError, match=f"line {blob + 1}: .*does not have the SHA-256 it claims"):
        qrun.parse([*lines[:blob], json.dumps(tampered).encode(), *lines[blob + 1 :]])
    with pytest.raises(qrun.RecordingError, match="not a quarry-run file"):
        qrun.parse([b'{"record":"run","run":{}}'])
    with pytest.raises(qrun.RecordingError, match="cannot read"):
        qrun.read(str(tmp_path / "absent.qrun"))
