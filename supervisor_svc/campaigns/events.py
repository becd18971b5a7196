"""Public campaign events built from the campaign's domain facts: the one place a CampaignEvent is made.

The builders take phases, records and monitor observations, never model output as such, so what a
client sees is what code decided to tell it.
"""

from __future__ import annotations

from datetime import datetime

from quarry.convert import JOB_STATES, EnumMap, job_ref_to_proto, timestamp
from quarry.records.campaign import TrialRecord, Violation, ViolationKind
from quarry.records.contract import ledger_row
from quarry.v1 import campaign_pb2, monitor_pb2
from supervisor_svc.campaigns.state import CampaignState, DirectiveState, JobProgress, Phase, SignalKind


class Event:
    """A public event as the campaign code handles it: opaque until stored, numbered and sent."""

    __slots__ = ("_message",)

    def __init__(self, message: campaign_pb2.CampaignEvent) -> None:
        self._message = message

    @property
    def terminal(self) -> bool:
        return self._message.HasField("ended")

    def stored(self, campaign_id: str, sequence_no: int, create_time: datetime) -> bytes:
        """The event as the campaign's log keeps it and StreamCampaign sends it."""
        self._message.campaign_id = campaign_id
        self._message.sequence_no = sequence_no
        self._message.create_time.FromDatetime(create_time)
        return self._message.SerializeToString()


STATES: EnumMap[CampaignState, campaign_pb2.CampaignState.ValueType] = EnumMap(
    {state: campaign_pb2.CampaignState.Value(f"CAMPAIGN_STATE_{state.name}") for state in CampaignState}
)
PHASES: EnumMap[Phase, campaign_pb2.CampaignPhase.ValueType] = EnumMap(
    {phase: campaign_pb2.CampaignPhase.Value(f"CAMPAIGN_PHASE_{phase.name}") for phase in Phase}
)
DIRECTIVE_STATES: EnumMap[DirectiveState, campaign_pb2.DirectiveState.ValueType] = EnumMap(
    {state: campaign_pb2.DirectiveState.Value(f"DIRECTIVE_STATE_{state.name}") for state in DirectiveState}
)
_RULES: EnumMap[ViolationKind, campaign_pb2.ViolationRule.ValueType] = EnumMap(
    {rule: campaign_pb2.ViolationRule.Value(f"VIOLATION_RULE_{rule.name}") for rule in ViolationKind}
)
_SIGNALS: EnumMap[SignalKind, campaign_pb2.CampaignSignalKind.ValueType] = EnumMap(
    {kind: campaign_pb2.CampaignSignalKind.Value(f"CAMPAIGN_SIGNAL_KIND_{kind.name}") for kind in SignalKind}
)


def phase_changed(phase: Phase, cycle: int, message: str = "") -> Event:
    changed = campaign_pb2.CampaignPhaseChangedEvent(phase=PHASES.to_proto(phase), cycle=cycle, message=message)
    return Event(campaign_pb2.CampaignEvent(phase_changed=changed))


def ledger_recorded(record: TrialRecord) -> Event:
    return Event(campaign_pb2.CampaignEvent(ledger_recorded=ledger_row(record)))


def job_progress(progress: JobProgress) -> Event:
    event = campaign_pb2.CampaignJobProgressEvent(
        cycle=progress.cycle,
        job=job_ref_to_proto(progress.job),
        state=JOB_STATES.to_proto(progress.state),
        gpu_indices=progress.gpu_indices,
        log_tail=progress.log_tail,
        metric_points=[
            monitor_pb2.MetricPoint(name=point.name, value=point.value, step=point.step)
            for point in progress.metric_points
        ],
    )
    return Event(campaign_pb2.CampaignEvent(job_progress=event))


def sleeping(reason: str, until: datetime) -> Event:
    event = campaign_pb2.CampaignSleepingEvent(reason=reason, until=timestamp(until))
    return Event(campaign_pb2.CampaignEvent(sleeping=event))


def paused(reason: str) -> Event:
    return Event(campaign_pb2.CampaignEvent(paused=campaign_pb2.CampaignPausedEvent(reason=reason)))


def resumed(reason: str) -> Event:
    return Event(campaign_pb2.CampaignEvent(resumed=campaign_pb2.CampaignResumedEvent(reason=reason)))


def directive_received(request_id: str, text: str, sent_by: str = "") -> Event:
    event = campaign_pb2.DirectiveReceivedEvent(request_id=request_id, text=text, sent_by=sent_by)
    return Event(campaign_pb2.CampaignEvent(directive_received=event))


def directive_consumed(request_id: str, cycle: int) -> Event:
    event = campaign_pb2.DirectiveConsumedEvent(request_id=request_id, cycle=cycle)
    return Event(campaign_pb2.CampaignEvent(directive_consumed=event))


def signal(kind: SignalKind, message: str, value: float | None = None) -> Event:
    event = campaign_pb2.CampaignSignalEvent(kind=_SIGNALS.to_proto(kind), message=message)
    if value is not None:
        event.value = value
    return Event(campaign_pb2.CampaignEvent(signal=event))


def violation(record: Violation) -> Event:
    event = campaign_pb2.CampaignViolationEvent(
        cycle=record.cycle, rule=_RULES.to_proto(record.rule), subject=record.subject, detail=record.detail
    )
    return Event(campaign_pb2.CampaignEvent(violation=event))


def ended(state: CampaignState, reason: str) -> Event:
    """The one terminal event of a campaign."""
    if not state.ended:
        raise ValueError(f"not a campaign's end: {state}")
    event = campaign_pb2.CampaignEndedEvent(state=STATES.to_proto(state), reason=reason)
    return Event(campaign_pb2.CampaignEvent(ended=event))
