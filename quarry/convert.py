"""The one place quarry.v1 messages meet kernel types: enums, usage, durations, timestamps and labels.

Servicers translate with these; a service's own enum gets its two-way map from EnumMap.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from google.protobuf import duration_pb2, timestamp_pb2

from quarry.agent.usage import Usage
from quarry.diagnostics import Report, Status
from quarry.errors import FieldViolation, InvalidArgument
from quarry.identity import Principal, Role
from quarry.records.research import ClaimJudgement
from quarry.records.verification import ObjectionStatus, SentenceStatus, Verification
from quarry.v1 import common_pb2, diagnostics_pb2, monitor_pb2, scratchpad_pb2, supervisor_pb2, worker_pb2
from quarry.vocabulary import (
    DelegationErrorCode,
    DelegationResult,
    Entry,
    EntryKind,
    Gpu,
    GpuProcess,
    JobLook,
    JobMetric,
    JobRef,
    JobState,
    MetricDirection,
    Source,
    Tier,
)

if TYPE_CHECKING:
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

__all__ = [
    "CLAIM_JUDGEMENTS",
    "DELEGATION_ERROR_CODES",
    "DIAGNOSTIC_STATUSES",
    "ENTRY_KINDS",
    "JOB_STATES",
    "METRIC_DIRECTIONS",
    "OBJECTION_STATUSES",
    "ROLES",
    "SENTENCE_STATUSES",
    "TIERS",
    "EnumMap",
    "delegation_result_from_proto",
    "delegation_result_to_proto",
    "diagnostics_report_to_proto",
    "duration",
    "duration_seconds",
    "entry_from_proto",
    "entry_to_proto",
    "enum_label",
    "gpu_from_proto",
    "gpu_to_proto",
    "job_look_from_proto",
    "job_look_to_proto",
    "job_ref_from_proto",
    "job_ref_to_proto",
    "metric_spec_to_proto",
    "principal_from_proto",
    "principal_to_proto",
    "readable_entries",
    "source_from_proto",
    "source_to_proto",
    "timestamp",
    "usage_from_proto",
    "usage_to_proto",
    "verification_to_proto",
]

_Member = TypeVar("_Member", bound=enum.Enum)
_Number = TypeVar("_Number", bound=int)


class EnumMap(Generic[_Member, _Number]):
    """A two-way map between a domain enum and a proto enum, from one table covering every member."""

    def __init__(self, table: Mapping[_Member, _Number]) -> None:
        self._to_proto = dict(table)
        self._from_proto: dict[int, _Member] = {number: member for member, number in table.items()}
        domain = type(next(iter(table)))
        missing = [member.name for member in domain if member not in table]
        if missing or len(self._from_proto) != len(table):
            raise ValueError(f"{domain.__name__} needs one distinct proto number per member; missing: {missing}")

    def to_proto(self, member: _Member) -> _Number:
        return self._to_proto[member]

    def from_proto(self, number: int) -> _Member | None:
        """None for the UNSPECIFIED value and for numbers this build does not know."""
        return self._from_proto.get(number)

    def requested(self, number: int, *, field: str, enum_name: str) -> _Member | None:
        """The member a request asks for; None for UNSPECIFIED (0, "unset"). A number this build does not
        know (one a newer client sends) is refused as INVALID_ARGUMENT on `field`, never taken as unset."""
        member = self.from_proto(number)
        if member is None and number != 0:
            raise InvalidArgument([FieldViolation(field, f"{number} is not a {enum_name} this server knows")])
        return member

    def known(self, numbers: Iterable[int]) -> list[_Member]:
        """The members among `numbers`, unknown ones dropped (for filters, where they match nothing)."""
        return [member for member in map(self.from_proto, numbers) if member is not None]


ROLES: EnumMap[Role, common_pb2.Role.ValueType] = EnumMap(
    {
        Role.SUPERVISOR: common_pb2.ROLE_SUPERVISOR,
        Role.RESEARCHER: common_pb2.ROLE_RESEARCHER,
        Role.VERIFIER: common_pb2.ROLE_VERIFIER,
        Role.ENGINEER: common_pb2.ROLE_ENGINEER,
        Role.CITATION_AUDITOR: common_pb2.ROLE_CITATION_AUDITOR,
        Role.ADJUDICATOR: common_pb2.ROLE_ADJUDICATOR,
        Role.BIBLIOGRAPHIC_VERIFIER: common_pb2.ROLE_BIBLIOGRAPHIC_VERIFIER,
        Role.SCOUT: common_pb2.ROLE_SCOUT,
        Role.EXTRACTOR: common_pb2.ROLE_EXTRACTOR,
        Role.WRITER: common_pb2.ROLE_WRITER,
    }
)

TIERS: EnumMap[Tier, common_pb2.ModelTier.ValueType] = EnumMap(
    {Tier.WORKER: common_pb2.MODEL_TIER_WORKER, Tier.SUPERVISOR: common_pb2.MODEL_TIER_SUPERVISOR}
)

ENTRY_KINDS: EnumMap[EntryKind, scratchpad_pb2.EntryKind.ValueType] = EnumMap(
    {
        EntryKind.SEED: scratchpad_pb2.ENTRY_KIND_SEED,
        EntryKind.FINDING: scratchpad_pb2.ENTRY_KIND_FINDING,
        EntryKind.REFUSAL: scratchpad_pb2.ENTRY_KIND_REFUSAL,
        EntryKind.SENTENCE: scratchpad_pb2.ENTRY_KIND_SENTENCE,
        EntryKind.BIBLIOGRAPHIC_VERDICT: scratchpad_pb2.ENTRY_KIND_BIBLIOGRAPHIC_VERDICT,
        EntryKind.CANDIDATES: scratchpad_pb2.ENTRY_KIND_CANDIDATES,
        EntryKind.EVIDENCE: scratchpad_pb2.ENTRY_KIND_EVIDENCE,
        EntryKind.MARKER: scratchpad_pb2.ENTRY_KIND_MARKER,
        EntryKind.ACKNOWLEDGEMENT: scratchpad_pb2.ENTRY_KIND_ACKNOWLEDGEMENT,
        EntryKind.NOTE: scratchpad_pb2.ENTRY_KIND_NOTE,
        EntryKind.VERDICT: scratchpad_pb2.ENTRY_KIND_VERDICT,
        EntryKind.AUDIT: scratchpad_pb2.ENTRY_KIND_AUDIT,
        EntryKind.OBJECTION: scratchpad_pb2.ENTRY_KIND_OBJECTION,
        EntryKind.ADJUDICATION: scratchpad_pb2.ENTRY_KIND_ADJUDICATION,
        EntryKind.ASSIGNMENT: scratchpad_pb2.ENTRY_KIND_ASSIGNMENT,
        EntryKind.ROUTE: scratchpad_pb2.ENTRY_KIND_ROUTE,
        EntryKind.USAGE: scratchpad_pb2.ENTRY_KIND_USAGE,
        EntryKind.RESOLUTION: scratchpad_pb2.ENTRY_KIND_RESOLUTION,
        EntryKind.CAMPAIGN_LEDGER: scratchpad_pb2.ENTRY_KIND_CAMPAIGN_LEDGER,
        EntryKind.CAMPAIGN_DEAD_END: scratchpad_pb2.ENTRY_KIND_CAMPAIGN_DEAD_END,
        EntryKind.CAMPAIGN_INSIGHT: scratchpad_pb2.ENTRY_KIND_CAMPAIGN_INSIGHT,
        EntryKind.CAMPAIGN_DIRECTIVE: scratchpad_pb2.ENTRY_KIND_CAMPAIGN_DIRECTIVE,
        EntryKind.CAMPAIGN_DECISION: scratchpad_pb2.ENTRY_KIND_CAMPAIGN_DECISION,
    }
)

JOB_STATES: EnumMap[JobState, monitor_pb2.JobState.ValueType] = EnumMap(
    {state: monitor_pb2.JobState.Value(f"JOB_STATE_{state.name}") for state in JobState}
)

METRIC_DIRECTIONS: EnumMap[MetricDirection, monitor_pb2.MetricDirection.ValueType] = EnumMap(
    {
        direction: monitor_pb2.MetricDirection.Value(f"METRIC_DIRECTION_{direction.name}")
        for direction in MetricDirection
    }
)

DELEGATION_ERROR_CODES: EnumMap[DelegationErrorCode, common_pb2.DelegationErrorCode.ValueType] = EnumMap(
    {code: common_pb2.DelegationErrorCode.Value(f"DELEGATION_ERROR_CODE_{code.name}") for code in DelegationErrorCode}
)

DIAGNOSTIC_STATUSES: EnumMap[Status, diagnostics_pb2.DiagnosticStatus.ValueType] = EnumMap(
    {status: diagnostics_pb2.DiagnosticStatus.Value(f"DIAGNOSTIC_STATUS_{status.name}") for status in Status}
)


def enum_label(enum_type: _EnumTypeWrapper[Any], number: int) -> str:
    """A proto enum value as a lowercase label without its prefix: JOB_STATE_TIMED_OUT -> "timed_out".

    Raises ValueError for a number the enum does not define, as the enum's Name does.
    """
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum_type.DESCRIPTOR.name).upper() + "_"
    return enum_type.Name(number).removeprefix(prefix).lower()


def principal_to_proto(principal: Principal) -> common_pb2.Principal:
    return common_pb2.Principal(principal_id=principal.principal_id, role=ROLES.to_proto(principal.role))


def principal_from_proto(message: common_pb2.Principal) -> Principal | None:
    """None when the role is unspecified or unknown to this build."""
    role = ROLES.from_proto(message.role)
    return None if role is None else Principal(message.principal_id, role)


def source_to_proto(source: Source) -> common_pb2.Source:
    return common_pb2.Source(url=source.url, title=source.title, excerpt=source.excerpt)


def source_from_proto(message: common_pb2.Source) -> Source:
    return Source(url=message.url, title=message.title, excerpt=message.excerpt)


def entry_to_proto(entry: Entry) -> scratchpad_pb2.Entry:
    return scratchpad_pb2.Entry(
        thread_id=entry.thread_id,
        sequence_no=entry.sequence_no,
        kind=ENTRY_KINDS.to_proto(entry.kind),
        author=principal_to_proto(entry.author),
        content=entry.content,
        sources=[source_to_proto(source) for source in entry.sources],
        create_time=timestamp(entry.create_time),
        request_id=entry.request_id,
    )


def entry_from_proto(message: scratchpad_pb2.Entry) -> Entry:
    """A committed entry as the scratchpad sent it: its kind and role are ones the scratchpad accepted.

    Raises ValueError for a kind or role this build does not know (a newer scratchpad's).
    """
    kind, author = ENTRY_KINDS.from_proto(message.kind), principal_from_proto(message.author)
    if kind is None or author is None:
        raise ValueError(f"entry {message.sequence_no} has a kind or role this build does not know")
    return Entry(
        thread_id=message.thread_id,
        sequence_no=message.sequence_no,
        kind=kind,
        author=author,
        content=message.content,
        sources=tuple(source_from_proto(source) for source in message.sources),
        create_time=message.create_time.ToDatetime(tzinfo=UTC),
        request_id=message.request_id,
    )


def readable_entries(messages: Iterable[scratchpad_pb2.Entry]) -> list[Entry]:
    """The entries this build can read: one of a kind or role a newer scratchpad added is left out (nothing
    here could act on it), where entry_from_proto would refuse it."""
    entries = []
    for message in messages:
        try:
            entries.append(entry_from_proto(message))
        except ValueError:
            continue
    return entries


def gpu_to_proto(gpu: Gpu) -> monitor_pb2.Gpu:
    return monitor_pb2.Gpu(
        host=gpu.host,
        index=gpu.index,
        uuid=gpu.uuid,
        name=gpu.name,
        memory_total_bytes=gpu.memory_total_bytes,
        memory_used_bytes=gpu.memory_used_bytes,
        utilization_percent=gpu.utilization_percent,
        temperature_celsius=gpu.temperature_celsius,
        power_watts=gpu.power_watts,
        processes=[
            monitor_pb2.GpuProcess(pid=p.pid, used_memory_bytes=p.used_memory_bytes, name=p.name) for p in gpu.processes
        ],
    )


def gpu_from_proto(message: monitor_pb2.Gpu) -> Gpu:
    return Gpu(
        index=message.index,
        uuid=message.uuid,
        name=message.name,
        memory_total_bytes=message.memory_total_bytes,
        memory_used_bytes=message.memory_used_bytes,
        utilization_percent=message.utilization_percent,
        temperature_celsius=message.temperature_celsius,
        power_watts=message.power_watts,
        processes=tuple(GpuProcess(p.pid, p.used_memory_bytes, p.name) for p in message.processes),
        host=message.host,
    )


def job_ref_from_proto(job: monitor_pb2.JobRef) -> JobRef:
    """The reference a JobRef names, unchecked (an unset target gives an empty kind)."""
    target = job.WhichOneof("target")
    found = job.monitor_job_id
    if target == "local":
        return JobRef("local", pid=job.local.pid, log_path=job.log_path, monitor_job_id=found)
    if target == "remote":
        return JobRef("remote", pid=job.remote.pid, host=job.remote.host, log_path=job.log_path, monitor_job_id=found)
    if target == "slurm":
        return JobRef(
            "slurm", host=job.slurm.host, job_id=job.slurm.job_id, log_path=job.log_path, monitor_job_id=found
        )
    return JobRef("", log_path=job.log_path, monitor_job_id=found)


def job_ref_to_proto(ref: JobRef) -> monitor_pb2.JobRef:
    message = monitor_pb2.JobRef(log_path=ref.log_path, monitor_job_id=ref.monitor_job_id)
    if ref.kind == "local":
        message.local.pid = ref.pid
    elif ref.kind == "remote":
        message.remote.CopyFrom(monitor_pb2.RemoteProcess(host=ref.host, pid=ref.pid))
    elif ref.kind == "slurm":
        message.slurm.CopyFrom(monitor_pb2.SlurmJob(host=ref.host, job_id=ref.job_id))
    return message


def job_look_to_proto(look: JobLook) -> monitor_pb2.JobStatus:
    status = monitor_pb2.JobStatus(
        state=JOB_STATES.to_proto(look.state),
        log_tail=look.log_tail,
        sample_time=timestamp(datetime.now(UTC)),
        detail=look.detail,
    )
    if look.exit_code is not None:
        status.exit_code = look.exit_code
    return status


def metric_spec_to_proto(
    name: str, direction: MetricDirection | None, *, log_regex: str = "", jsonl_path: str = "", jsonl_key: str = ""
) -> monitor_pb2.MetricSpec:
    """A metric a job reports: read from its log by a pattern, or from a JSON-lines file (which wins if both are
    given); a direction of None leaves it unspecified (the monitor refuses it)."""
    spec = monitor_pb2.MetricSpec(name=name)
    if direction is not None:
        spec.direction = METRIC_DIRECTIONS.to_proto(direction)
    if log_regex:
        spec.log_regex = log_regex
    if jsonl_path or jsonl_key:
        spec.jsonl_file.CopyFrom(monitor_pb2.JsonlMetric(path=jsonl_path, key=jsonl_key))
    return spec


def job_look_from_proto(status: monitor_pb2.JobStatus) -> JobLook:
    return JobLook(
        state=JOB_STATES.from_proto(status.state) or JobState.UNKNOWN,
        exit_code=status.exit_code if status.HasField("exit_code") else None,
        detail=status.detail,
        log_tail=tuple(status.log_tail),
        metrics=tuple(_job_metric(metric) for metric in status.metrics),
    )


def _job_metric(metric: monitor_pb2.MetricResult) -> JobMetric:
    found = metric.state == monitor_pb2.METRIC_STATE_FOUND
    return JobMetric(
        metric.name,
        value=metric.value if found else None,
        best=metric.best if found else None,
        count=metric.count,
        detail=metric.detail,
    )


def delegation_result_to_proto(result: DelegationResult) -> worker_pb2.DelegationResult:
    message = worker_pb2.DelegationResult(
        delegation_id=result.delegation_id,
        outcome=common_pb2.DELEGATION_OUTCOME_SUCCEEDED if result.succeeded else common_pb2.DELEGATION_OUTCOME_FAILED,
        summary=result.summary,
        promoted_sequence_nos=list(result.promoted),
        turns_used=result.turns,
        usage=usage_to_proto(result.usage),
        conversation_id=result.conversation_id,
        tool_call_id=result.tool_call_id,
        worker_id=result.worker_id,
        jobs=[job_ref_to_proto(job) for job in result.jobs],
        files_changed=list(result.files_changed),
        output_kind=result.output_kind,
        output_json=result.output_json,
        output_sequence_no=result.output_sequence_no,
        tier=TIERS.to_proto(result.tier) if result.tier is not None else common_pb2.MODEL_TIER_UNSPECIFIED,
        model=result.model,
    )
    if result.error_code is not None:
        code = DELEGATION_ERROR_CODES.to_proto(result.error_code)
        message.error.CopyFrom(common_pb2.DelegationError(code=code, message=result.error_message))
    return message


def delegation_result_from_proto(message: worker_pb2.DelegationResult) -> DelegationResult:
    """A failure whose code this build does not know (or that names none) reads as INTERNAL."""
    code = None
    if message.outcome != common_pb2.DELEGATION_OUTCOME_SUCCEEDED:
        code = DELEGATION_ERROR_CODES.from_proto(message.error.code) or DelegationErrorCode.INTERNAL
    return DelegationResult(
        delegation_id=message.delegation_id,
        tool_call_id=message.tool_call_id,
        conversation_id=message.conversation_id,
        error_code=code,
        error_message=message.error.message,
        summary=message.summary,
        promoted=tuple(message.promoted_sequence_nos),
        turns=message.turns_used,
        usage=usage_from_proto(message.usage),
        worker_id=message.worker_id,
        jobs=tuple(job_ref_from_proto(job) for job in message.jobs),
        files_changed=tuple(message.files_changed),
        output_kind=message.output_kind,
        output_json=message.output_json,
        output_sequence_no=message.output_sequence_no,
        tier=TIERS.from_proto(message.tier),
        model=message.model,
    )


def usage_to_proto(usage: Usage) -> common_pb2.Usage:
    return common_pb2.Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        model_calls=usage.model_calls,
        tool_calls=usage.tool_calls,
        estimated_calls=usage.estimated_calls,
    )


def usage_from_proto(message: common_pb2.Usage) -> Usage:
    return Usage(
        input_tokens=message.input_tokens,
        output_tokens=message.output_tokens,
        model_calls=message.model_calls,
        tool_calls=message.tool_calls,
        estimated_calls=message.estimated_calls,
    )


def duration_seconds(value: duration_pb2.Duration) -> float:
    # Computed by hand: ToTimedelta overflows on absurd values, which validation should refuse.
    return value.seconds + value.nanos / 1e9


def duration(seconds: float) -> duration_pb2.Duration:
    message = duration_pb2.Duration()
    message.FromNanoseconds(round(seconds * 1e9))
    return message


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp(value: datetime) -> timestamp_pb2.Timestamp:
    # By arithmetic: Timestamp.FromDatetime goes through a time tuple, a fifth of an entry's conversion.
    micros = (value.astimezone(UTC) - _EPOCH) // timedelta(microseconds=1)
    seconds, fraction = divmod(micros, 1_000_000)
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=fraction * 1000)


def diagnostics_report_to_proto(report: Report) -> diagnostics_pb2.GetDiagnosticsResponse:
    return diagnostics_pb2.GetDiagnosticsResponse(
        service=report.service,
        version=report.version,
        facts=[diagnostics_pb2.DiagnosticFact(name=f.name, value=f.value, setting=f.setting) for f in report.facts],
        checks=[
            diagnostics_pb2.DiagnosticCheck(
                name=name,
                status=DIAGNOSTIC_STATUSES.to_proto(finding.status),
                detail=finding.detail,
                setting=finding.setting,
            )
            for name, finding in report.findings
        ],
        check_time=timestamp(report.checked_at),
    )


CLAIM_JUDGEMENTS: EnumMap[ClaimJudgement, supervisor_pb2.ClaimJudgement.ValueType] = EnumMap(
    {judged: supervisor_pb2.ClaimJudgement.Value(f"CLAIM_JUDGEMENT_{judged.name}") for judged in ClaimJudgement}
)
SENTENCE_STATUSES: EnumMap[SentenceStatus, supervisor_pb2.SentenceStatus.ValueType] = EnumMap(
    {status: supervisor_pb2.SentenceStatus.Value(f"SENTENCE_STATUS_{status.name}") for status in SentenceStatus}
)
OBJECTION_STATUSES: EnumMap[ObjectionStatus, supervisor_pb2.ObjectionStatus.ValueType] = EnumMap(
    {status: supervisor_pb2.ObjectionStatus.Value(f"OBJECTION_STATUS_{status.name}") for status in ObjectionStatus}
)


def verification_to_proto(verification: Verification) -> supervisor_pb2.Verification:
    citable, contested = verification.citable_findings(), verification.contested_findings()
    return supervisor_pb2.Verification(
        enabled=verification.enabled,
        findings=[
            supervisor_pb2.FindingCheck(
                finding_sequence_no=f.finding_sequence_no,
                claim=f.claim,
                # No judgement: no verifier could judge it.
                judgement=CLAIM_JUDGEMENTS.to_proto(f.judgement)
                if f.judgement is not None
                else supervisor_pb2.CLAIM_JUDGEMENT_UNVERIFIED,
                verdict_sequence_no=f.verdict_sequence_no,
                rationale=f.rationale,
                quote_url=f.quote_url,
                quote_excerpt=f.quote_excerpt,
                citable=f.finding_sequence_no in citable,
                contested=f.finding_sequence_no in contested,
            )
            for f in verification.findings
        ],
        sentences=[
            supervisor_pb2.SentenceCheck(
                sentence_index=s.sentence_index,
                text=s.text,
                finding_sequence_nos=s.finding_sequence_nos,
                status=SENTENCE_STATUSES.to_proto(s.status),
                audit_sequence_nos=s.audit_sequence_nos,
            )
            for s in verification.sentences
        ],
        objections=[
            supervisor_pb2.ObjectionState(
                objection_sequence_no=o.objection_sequence_no,
                sentence_index=o.sentence_index,
                reason=o.reason,
                status=OBJECTION_STATUSES.to_proto(o.status),
                adjudication_sequence_no=o.adjudication_sequence_no,
                resolution_sequence_no=o.resolution_sequence_no,
            )
            for o in verification.objections
        ],
        contradictions=[
            supervisor_pb2.Contradiction(
                finding_sequence_no=c.finding_sequence_no,
                claim=c.claim,
                finding_url=c.finding_url,
                finding_excerpt=c.finding_excerpt,
                contradicting_url=c.contradicting_url,
                contradicting_excerpt=c.contradicting_excerpt,
                rationale=c.rationale,
                verdict_sequence_no=c.verdict_sequence_no,
                contradicting_finding_sequence_nos=c.contradicting_finding_sequence_nos,
            )
            for c in verification.contradictions
        ],
        supported_claims=verification.supported_claims,
        removed_claims=verification.removed_claims,
        contested_claims=verification.contested_claims,
        revision_rounds=verification.revision_rounds,
    )
