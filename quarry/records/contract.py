"""A campaign's records and signals as the public contract (quarry.v1) carries them, both ways.

The one translation between `TrialRecord`/`Signals` and `LedgerRow`/`CampaignSignals`: the server
writes rows with it, and a reader of rows (the command line, a script) reads them back with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC

from quarry.convert import JOB_STATES, EnumMap, timestamp
from quarry.records.campaign import TrialRecord, Verdict
from quarry.records.signals import MetricGoal, SignalRules, Signals, read_signals
from quarry.v1 import campaign_pb2

__all__ = ["VERDICTS", "ledger_record", "ledger_row", "ledger_rows", "signals_to_proto"]

VERDICTS: EnumMap[Verdict, campaign_pb2.LedgerVerdict.ValueType] = EnumMap(
    {verdict: campaign_pb2.LedgerVerdict.Value(f"LEDGER_VERDICT_{verdict.name}") for verdict in Verdict}
)


def signals_to_proto(signals: Signals) -> campaign_pb2.CampaignSignals:
    message = campaign_pb2.CampaignSignals(
        best_commit=signals.best_commit,
        experiments=signals.experiments,
        experiments_since_keep=signals.experiments_since_keep,
        baseline_runs_needed=signals.baseline_runs_needed,
        stagnant=signals.stagnant,
        phase_gate_cleared=signals.phase_gate_cleared,
    )
    if signals.best is not None:
        message.best_value = signals.best
    if signals.noise is not None:
        message.noise_floor = signals.noise.floor
        message.baseline_mean = signals.noise.mean
        message.baseline_sample_std = signals.noise.sample_std
        message.baseline_batch_runs = signals.noise.runs
    if signals.retest is not None:
        message.retest_commit = signals.retest.commit
        message.retest_values.extend(signals.retest.runs)
    return message


def ledger_row(record: TrialRecord, signals: Signals | None = None) -> campaign_pb2.LedgerRow:
    """The row of one ledger record; with the signals after it when given."""
    row = campaign_pb2.LedgerRow(
        cycle=record.cycle,
        hypothesis=record.hypothesis,
        action=record.action,
        commit=record.commit,
        job_id=record.job_id,
        verdict=VERDICTS.to_proto(record.verdict),
        conclusion=record.conclusion,
        tokens_used=record.tokens_used,
        start_time=timestamp(record.started_at),
        end_time=timestamp(record.ended_at),
    )
    if record.job_state is not None:
        row.job_state = JOB_STATES.to_proto(record.job_state)
    if record.exit_code is not None:
        row.exit_code = record.exit_code
    for name, value in record.metrics.items():
        metric = row.metrics.add(name=name)
        if value is not None:
            metric.value = value
    if signals is not None:
        row.signals.CopyFrom(signals_to_proto(signals))
    return row


def ledger_rows(
    ledger: Sequence[TrialRecord], goal: MetricGoal, rules: SignalRules, *, first: int = 0
) -> list[campaign_pb2.LedgerRow]:
    """The ledger's rows from index `first` on (in cycle order), each with the signals after it."""
    return [
        ledger_row(ledger[index], read_signals(ledger[: index + 1], goal, rules)) for index in range(first, len(ledger))
    ]


def ledger_record(row: campaign_pb2.LedgerRow) -> TrialRecord:
    """A ledger row as the record it mirrors. Raises ValueError for a verdict this build does not know."""
    verdict = VERDICTS.from_proto(row.verdict)
    if verdict is None:
        raise ValueError(f"ledger row {row.cycle} has a verdict this build does not know")
    return TrialRecord(
        cycle=row.cycle,
        hypothesis=row.hypothesis,
        action=row.action,
        commit=row.commit,
        job_id=row.job_id,
        job_state=JOB_STATES.from_proto(row.job_state),
        exit_code=row.exit_code if row.HasField("exit_code") else None,
        metrics={metric.name: metric.value if metric.HasField("value") else None for metric in row.metrics},
        verdict=verdict,
        conclusion=row.conclusion,
        tokens_used=row.tokens_used,
        started_at=row.start_time.ToDatetime(tzinfo=UTC),
        ended_at=row.end_time.ToDatetime(tzinfo=UTC),
    )
