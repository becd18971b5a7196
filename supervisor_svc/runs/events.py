"""Public run events built from the supervisor's domain facts: the one place a RunEvent is made.

Internal traffic has no way in: the builders here take phases, entries and
text, never tool calls, so no delegation, scratchpad or web tool request can
reach a client as something to execute.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from quarry.convert import (
    CLAIM_JUDGEMENTS,
    DELEGATION_ERROR_CODES,
    ENTRY_KINDS,
    EnumMap,
    principal_to_proto,
    usage_to_proto,
    verification_to_proto,
)
from quarry.records.research import entry_preview
from quarry.v1 import common_pb2, supervisor_pb2
from quarry.vocabulary import DelegationResult, Entry
from supervisor_svc.runs.domain import (
    Citation,
    Report,
    ResearchPhase,
    RunErrorCode,
    RunOutcome,
    RunState,
    RunUsage,
    RunWarning,
)


class PublicEvent:
    """A public event as the rest of the supervisor handles it: opaque until stored, numbered and sent."""

    __slots__ = ("_message",)

    def __init__(self, message: supervisor_pb2.RunEvent) -> None:
        self._message = message

    def stored(self, run_id: str, sequence_no: int, create_time: datetime) -> bytes:
        """The event as the run's log keeps it and StreamRun sends it: numbered within its run."""
        self._message.run_id = run_id
        self._message.sequence_no = sequence_no
        self._message.create_time.FromDatetime(create_time)
        return self._message.SerializeToString()


_ERROR_CODES: EnumMap[RunErrorCode, supervisor_pb2.RunErrorCode.ValueType] = EnumMap(
    {code: supervisor_pb2.RunErrorCode.Value(f"RUN_ERROR_CODE_{code.name}") for code in RunErrorCode}
)
_WARNING_CODES: EnumMap[RunWarning, supervisor_pb2.RunWarningCode.ValueType] = EnumMap(
    {warning: supervisor_pb2.RunWarningCode.Value(f"RUN_WARNING_CODE_{warning.name}") for warning in RunWarning}
)
_PHASES: EnumMap[ResearchPhase, supervisor_pb2.ResearchPhase.ValueType] = EnumMap(
    {phase: supervisor_pb2.ResearchPhase.Value(f"RESEARCH_PHASE_{phase.name}") for phase in ResearchPhase}
)


def run_usage_to_proto(usage: RunUsage) -> supervisor_pb2.RunUsage:
    return supervisor_pb2.RunUsage(
        supervisor=usage_to_proto(usage.supervisor),
        workers=usage_to_proto(usage.workers),
        total=usage_to_proto(usage.total),
        verification=usage_to_proto(usage.verification),
    )


def report_to_proto(report: Report) -> supervisor_pb2.Report:
    return supervisor_pb2.Report(markdown=report.markdown, citations=[_citation(c) for c in report.citations])


def _citation(citation: Citation) -> supervisor_pb2.Citation:
    message = supervisor_pb2.Citation(
        number=citation.number,
        url=citation.url,
        title=citation.title,
        excerpt=citation.excerpt,
        scratchpad_sequence_no=citation.sequence_no,
    )
    if citation.judgement is not None:
        message.judgement = CLAIM_JUDGEMENTS.to_proto(citation.judgement)
    return message


def error_to_proto(code: RunErrorCode, message: str) -> supervisor_pb2.RunError:
    return supervisor_pb2.RunError(code=_ERROR_CODES.to_proto(code), message=message)


def warnings_to_proto(warnings: Sequence[RunWarning]) -> list[supervisor_pb2.RunWarning]:
    return [supervisor_pb2.RunWarning(code=_WARNING_CODES.to_proto(w), message=w.message) for w in warnings]


def status(phase: ResearchPhase, message: str, *, delegation_id: str = "", worker_id: str = "") -> PublicEvent:
    return PublicEvent(_status(phase, message, delegation_id, worker_id))


def _status(
    phase: ResearchPhase, message: str, delegation_id: str = "", worker_id: str = ""
) -> supervisor_pb2.RunEvent:
    event = supervisor_pb2.ResearchStatusEvent(
        phase=_PHASES.to_proto(phase), message=message, delegation_id=delegation_id, worker_id=worker_id
    )
    return supervisor_pb2.RunEvent(status=event)


def delegation_ended(result: DelegationResult) -> PublicEvent:
    """WORKER_COMPLETED or WORKER_FAILED, with the outcome, the worker and, on failure, the error."""
    if result.error_code is None:
        event = _status(ResearchPhase.WORKER_COMPLETED, "worker finished", result.delegation_id, result.worker_id)
        event.status.delegation_outcome = common_pb2.DELEGATION_OUTCOME_SUCCEEDED
        return PublicEvent(event)
    message = f"worker failed: {result.error_message}"
    event = _status(ResearchPhase.WORKER_FAILED, message, result.delegation_id, result.worker_id)
    event.status.delegation_outcome = common_pb2.DELEGATION_OUTCOME_FAILED
    event.status.delegation_error.code = DELEGATION_ERROR_CODES.to_proto(result.error_code)
    event.status.delegation_error.message = result.error_message
    return PublicEvent(event)


def preview(entry: Entry) -> str:
    return entry_preview(entry.kind, entry.content)


def scratchpad_entry(entry: Entry) -> PublicEvent:
    return PublicEvent(
        supervisor_pb2.RunEvent(
            scratchpad=supervisor_pb2.ScratchpadEvent(
                scratchpad_sequence_no=entry.sequence_no,
                kind=ENTRY_KINDS.to_proto(entry.kind),
                author=principal_to_proto(entry.author),
                preview=preview(entry),
            )
        )
    )


def reasoning(delta: str) -> PublicEvent:
    return PublicEvent(supervisor_pb2.RunEvent(reasoning=supervisor_pb2.ReasoningEvent(delta=delta)))


def content(delta: str) -> PublicEvent:
    return PublicEvent(supervisor_pb2.RunEvent(content=supervisor_pb2.ContentEvent(delta=delta)))


def ending(outcome: RunOutcome) -> PublicEvent:
    """The one terminal event of a run: completed, failed or cancelled."""
    usage = run_usage_to_proto(outcome.usage)
    if outcome.state is RunState.SUCCEEDED:
        report = outcome.report or Report(markdown="")
        completed = supervisor_pb2.RunCompletedEvent(
            report=report_to_proto(report),
            usage=usage,
            removed_citations=report.removed_citations,
            token_budget_exhausted=report.token_budget_exhausted,
            turn_budget_exhausted=report.turn_budget_exhausted,
            warnings=warnings_to_proto(outcome.warnings),
        )
        if outcome.verification is not None:
            completed.verification.CopyFrom(verification_to_proto(outcome.verification))
        return PublicEvent(supervisor_pb2.RunEvent(completed=completed))
    if outcome.state is RunState.CANCELLED:
        return PublicEvent(
            supervisor_pb2.RunEvent(cancelled=supervisor_pb2.RunCancelledEvent(reason=outcome.message, usage=usage))
        )
    if outcome.state is RunState.FAILED and outcome.error_code is not None:
        error = error_to_proto(outcome.error_code, outcome.message)
        return PublicEvent(supervisor_pb2.RunEvent(failed=supervisor_pb2.RunFailedEvent(error=error, usage=usage)))
    raise ValueError(f"not a run's ending: {outcome.state} {outcome.error_code}")
