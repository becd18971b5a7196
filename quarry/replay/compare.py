"""Comparing a replayed run with its recording: its events in order, then the run as GetRun shows it.

Times differ between any two executions and are left out; the ids a replay mints afresh are read as the
recorded ones. Anything else that differs is the replay's first difference, named by where it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quarry.replay.qrun import RunRecording

# Fields of the protobuf JSON mapping that differ between any two executions.
_CLOCK_FIELDS = frozenset({"createTime", "startTime", "endTime"})


def normalized(value: Any, ids: Sequence[tuple[str, str]]) -> Any:
    """`value` without its times, with (replayed, recorded) ids read as the recorded ones."""
    if isinstance(value, dict):
        return {key: normalized(item, ids) for key, item in value.items() if key not in _CLOCK_FIELDS}
    if isinstance(value, list):
        return [normalized(item, ids) for item in value]
    if isinstance(value, str):
        for replayed, recorded in ids:
            value = value.replace(replayed, recorded)
    return value


def first_difference(recorded: Any, replayed: Any, path: str = "") -> str | None:
    """Where two JSON values first differ ("report.markdown: recorded '…', replayed '…'"), or None."""
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        for key in sorted(set(recorded) | set(replayed)):
            found = first_difference(recorded.get(key), replayed.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(recorded, list) and isinstance(replayed, list):
        for index, (was, now) in enumerate(zip(recorded, replayed, strict=False)):
            found = first_difference(was, now, f"{path}[{index}]")
            if found:
                return found
        if len(recorded) != len(replayed):
            return f"{path or 'the value'}: {len(recorded)} items recorded, {len(replayed)} replayed"
        return None
    if recorded != replayed:
        return f"{path or 'the value'}: recorded {_short(recorded)}, replayed {_short(replayed)}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def run_difference(
    recording: RunRecording, run: dict[str, Any], events: Sequence[dict[str, Any]], ids: Sequence[tuple[str, str]]
) -> str | None:
    """The first difference between the recorded run and a replay of it: in its events, then in the run.

    A run's events come from sources that run side by side: the run itself, each delegation (its status
    events) and the scratchpad it follows. How they interleave depends on timing, so each source's events
    are compared in order, and the sequence numbers that number the interleaving are not.
    """
    recorded = _by_source(recording.events, ())
    replayed = _by_source(events, ids)
    for source, was in recorded.items():
        now = replayed.get(source, [])
        for number, (before, after) in enumerate(zip(was, now, strict=False), 1):
            found = first_difference(before, after)
            if found:
                return f"{source}, event {number}: {found}"
        if len(was) != len(now):
            return f"{source}: the replay has {len(now)} events where the recording has {len(was)}"
    extra = [source for source in replayed if source not in recorded]
    if extra:
        return f"{extra[0]}: events the recording does not have"
    found = first_difference(normalized(recording.run, ()), normalized(run, ids))
    return None if found is None else f"the run: {found}"


def _by_source(events: Sequence[dict[str, Any]], ids: Sequence[tuple[str, str]]) -> dict[str, list[Any]]:
    """Events by the source that made them, each without its sequence number, in order."""
    sources: dict[str, list[Any]] = {}
    for event in events:
        shown = normalized({key: value for key, value in event.items() if key != "sequenceNo"}, ids)
        delegation = (shown.get("status") or {}).get("delegationId")
        source = "the scratchpad" if "scratchpad" in shown else f"delegation {delegation}" if delegation else "the run"
        sources.setdefault(source, []).append(shown)
    return sources
