"""The campaign loop: BASELINE, then THINK -> EXECUTE -> WAIT -> REFLECT, one cycle at a time.

The loop is code; the model only thinks. THINK is a leader conversation on the shared agent
kernel that lives for one cycle, may have a researcher read the literature first, and may hand the
change to an engineer worker; the loop itself commits the engineer's edits, launches the experiment
through the monitor, waits for it with no model call at all, reads the metric the monitor parsed,
and decides by `signals.judge`.

Every record (ledger rows, dead ends, insights, directives, decisions) is a typed entry on the
campaign's scratchpad thread, keyed by a request_id derived from the campaign and the cycle, so a
redone step writes nothing twice; the ledger row is also recorded once per cycle in the campaign's
store. A job is submitted with a request_id per cycle and run, so a loop that restarts mid-cycle
gets the job it launched back from the monitor instead of launching a second one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from pydantic import BaseModel, Field

from quarry.agent.conversation import ConversationStore
from quarry.agent.loop import AgentRun, LoopLimits, LoopObserver
from quarry.agent.messages import system, user
from quarry.agent.model import ModelClient
from quarry.agent.tools import Tool, ToolRegistry, current_call
from quarry.clients.monitor import MonitorClient
from quarry.convert import JOB_STATES, job_ref_from_proto
from quarry.errors import DeadlineExceeded, QuarryError, ResourceExhausted, Unavailable
from quarry.identity import Principal, Role
from quarry.records.campaign import (
    CampaignRecord,
    DeadEnd,
    Decision,
    Directive,
    DirectiveConsumed,
    Insight,
    LedgerRecord,
    Verdict,
    Violation,
    record_from_json,
)
from quarry.records.signals import Direction, Signals, read_signals
from quarry.research_plane import ResearchPlane
from quarry.v1 import monitor_pb2
from quarry.vocabulary import DelegationResult, EntryKind, JobState
from supervisor_svc.campaigns import events, exports, limiter, memory, violations
from supervisor_svc.campaigns.model import (
    CampaignSpec,
    CampaignState,
    JobProgress,
    MetricPoint,
    Phase,
    Progress,
    SignalKind,
    branch_name,
)
from supervisor_svc.campaigns.service import CampaignHandle, CampaignLoop, CampaignLoopFactory
from supervisor_svc.runs.domain import DelegationOrder
from supervisor_svc.runs.tools import Criterion
from supervisor_svc.runs.worker_client import DelegationClient

log = logging.getLogger(__name__)

_KINDS: dict[type[Any], EntryKind] = {
    LedgerRecord: EntryKind.CAMPAIGN_LEDGER,
    DeadEnd: EntryKind.CAMPAIGN_DEAD_END,
    Insight: EntryKind.CAMPAIGN_INSIGHT,
    Directive: EntryKind.CAMPAIGN_DIRECTIVE,
    DirectiveConsumed: EntryKind.CAMPAIGN_DIRECTIVE,
    Decision: EntryKind.CAMPAIGN_DECISION,
    Violation: EntryKind.CAMPAIGN_DECISION,
}
_RECORD_KINDS = frozenset(_KINDS.values())

INSTRUCTIONS = """You lead one cycle of an experiment campaign on a code workspace.
Read the brief, the memory, the signals and the recent experiments, then choose ONE hypothesis: a
single change that could improve the metric. Never retry a dead end. Follow the human's directives.
Have an engineer make the change with delegate_engineer (it edits the workspace; it must not run the
full experiment: the campaign runs it after you). Before choosing, you may have a researcher look
something up in the literature with delegate_research. You may record an insight or a dead end.
End with a short answer that states the hypothesis, and nothing else."""


@dataclass(frozen=True)
class LoopSettings:
    # How long a THINK may take (turns) and an engineer delegation may run.
    think_turns: int = 8
    engineer_turns: int = 0  # 0: the worker's default
    engineer_timeout_seconds: float = 900.0
    research_turns: int = 0  # 0: the worker's default
    research_timeout_seconds: float = 900.0
    # How often the monitor reports a running job (seconds); the wait costs no model call.
    watch_poll_seconds: int = 2
    # After a failed step (the monitor unreachable), wait this long before the cycle is tried again.
    retry_seconds: float = 5.0


@dataclass(frozen=True)
class LoopDependencies:
    model: ModelClient
    conversations: ConversationStore
    scratchpad: ResearchPlane
    delegations: DelegationClient
    monitor: MonitorClient
    settings: LoopSettings = field(default_factory=LoopSettings)


def loop_factory(deps: LoopDependencies) -> CampaignLoopFactory:
    def make(handle: CampaignHandle) -> CampaignLoop:
        return CampaignRun(handle, deps)

    return make


# -- THINK's tools -----------------------------------------------------------------------------------


class EngineerParams(BaseModel):
    change: str = Field(min_length=1, max_length=4000, description="the change to make, self-contained")


class ResearchParams(BaseModel):
    objective: str = Field(min_length=1, max_length=4000, description="the research task, self-contained")
    criteria: list[Criterion] = Field(default_factory=list, max_length=10, description="what a good answer must show")


class NoteParams(BaseModel):
    text: str = Field(min_length=1, max_length=1000)


class DeadEndParams(BaseModel):
    approach: str = Field(min_length=1, max_length=1000)
    reason: str = Field(min_length=1, max_length=1000)


@dataclass
class ThinkContext:
    run: CampaignRun
    cycle: int
    attempt: str  # this THINK's conversation: a THINK redone after a restart delegates under new ids
    tokens: int = 0
    changes: list[str] = field(default_factory=list)
    files: set[str] = field(default_factory=set)
    researched: int = 0


async def delegate_engineer(params: EngineerParams, context: ThinkContext) -> str:
    return await context.run.engineer(params.change, context)


async def delegate_research(params: ResearchParams, context: ThinkContext) -> str:
    return await context.run.research(params.objective, tuple(params.criteria), context)


async def record_insight(params: NoteParams, context: ThinkContext) -> str:
    await context.run.write(Insight(cycle=context.cycle, text=params.text), f"insight/{current_call().id}")
    return "recorded"


async def record_dead_end(params: DeadEndParams, context: ThinkContext) -> str:
    entry = DeadEnd(cycle=context.cycle, approach=params.approach, reason=params.reason)
    await context.run.write(entry, f"dead-end/{current_call().id}")
    return "recorded"


THINK_TOOLS: ToolRegistry[ThinkContext] = ToolRegistry(
    [
        Tool(
            "delegate_engineer",
            "Have an engineer make the change in the workspace (on the campaign's branch); returns what it did.",
            EngineerParams,
            delegate_engineer,
        ),
        Tool(
            "delegate_research",
            "Have a researcher look something up in the literature; returns its summary and how many findings "
            "it promoted to the campaign's thread.",
            ResearchParams,
            delegate_research,
        ),
        Tool("record_insight", "Keep a durable observation in the campaign's insights.", NoteParams, record_insight),
        Tool(
            "record_dead_end", "Record an approach that failed, so it is never retried.", DeadEndParams, record_dead_end
        ),
    ]
)


# -- the loop ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _JobEnd:
    job_id: str
    state: JobState
    exit_code: int | None
    value: float | None
    detail: str
    seconds: float | None = None  # how long the wait for it took here (None: no job)


class CampaignRun:
    def __init__(self, handle: CampaignHandle, deps: LoopDependencies) -> None:
        self._handle = handle
        self._deps = deps
        self._spec: CampaignSpec = handle.record.spec
        self._id = handle.campaign_id
        self._thread = handle.record.scratchpad_thread_id or handle.campaign_id
        self._branch = handle.record.branch or branch_name(handle.campaign_id)
        self._author = Principal(principal_id=f"campaign-{handle.campaign_id}", role=Role.SUPERVISOR)
        self._workspace_id = ""
        self._seen_directives: set[str] = set()

    # -- the records ---------------------------------------------------------------------------------

    async def write(self, record: CampaignRecord, key: str) -> None:
        """Append a record to the campaign's thread once per key."""
        await self._deps.scratchpad.append(
            self._thread,
            kind=_KINDS[type(record)],
            author=self._author,
            content=record.to_json(),
            request_id=f"{self._id}/{key}",
        )

    async def records(self) -> list[CampaignRecord]:
        entries = await self._deps.scratchpad.read_all(self._thread)
        return [record_from_json(entry.content) for entry in entries if entry.kind in _RECORD_KINDS]

    # -- driving -------------------------------------------------------------------------------------

    async def run(self) -> None:
        set_up = False
        while True:
            try:
                if not set_up:
                    if not await self._set_up():
                        branch = self._branch
                        await self._handle.pause(
                            f"the workspace is not on the campaign's branch {branch}: check it out"
                        )
                        return
                    set_up = True
                if await self._step():
                    return
            except (QuarryError, grpc.aio.AioRpcError) as error:
                if not _transient(error):  # refused (a root not allowed, submission off...): a human must look
                    await self._handle.pause(f"a service refused the campaign: {_describe(error)}")
                    return
                # The monitor, a worker or the scratchpad is unreachable or busy: the step is redone, idempotently.
                log.warning("campaign %s: a step failed, retrying: %s", self._id, _describe(error))
                await asyncio.sleep(self._deps.settings.retry_seconds)

    async def _set_up(self) -> bool:
        """Open the workspace on the campaign's branch and the campaign's thread; False when the workspace is on
        another branch (someone checked one out)."""
        spec, monitor = self._spec, self._deps.monitor
        with contextlib.suppress(QuarryError):  # it exists: a restart
            await self._deps.scratchpad.create_thread(
                self._thread, title=spec.title or spec.brief.goal[:200], request_id=f"{self._id}/thread"
            )
        workspace = await monitor.open_workspace(
            spec.workspace.root,
            host=spec.workspace.host,
            protected_paths=spec.brief.protected_paths,
            request_id=f"{self._id}/open",
        )
        self._workspace_id = workspace.workspace_id
        if workspace.git.branch != self._branch:
            # Made once (a repeat answers the first result); the loop never leaves the branch afterwards.
            workspace = await monitor.create_workspace_branch(
                self._workspace_id, self._branch, request_id=f"{self._id}/branch"
            )
        return workspace.git.branch == self._branch

    async def _step(self) -> bool:
        """One cycle, or one wait; True once the campaign ended or paused."""
        handle, spec = self._handle, self._spec
        current = await handle.current()
        records = await self.records()
        ledger = [record for record in records if isinstance(record, LedgerRecord)]
        signals = read_signals(ledger, spec.metric.goal, spec.signal_rules())
        if signals.phase_gate_cleared and spec.rules.stop_at_phase_gate:
            await handle.finish(CampaignState.COMPLETED, f"the phase gate is cleared: {signals.best:.6g}")
            return True
        history = [limiter.CycleCost.of(record) for record in ledger]
        now = datetime.now(UTC)
        admission = limiter.admit(history, now, spec.limits(), failures_since=current.resume_time)
        if admission.step is limiter.Step.DONE:
            await handle.finish(CampaignState.COMPLETED, admission.reason)
            return True
        if admission.step is limiter.Step.PAUSE:
            await handle.pause(admission.reason)
            return True
        if admission.step is limiter.Step.SLEEP:
            await handle.sleep(now + timedelta(seconds=admission.sleep_seconds), admission.reason)
            await asyncio.sleep(admission.sleep_seconds)
            return False
        cycle = len(ledger) + 1
        if signals.baseline_runs_needed:
            await self._measure(cycle, signals, Phase.BASELINE, "baseline", "run the unchanged kept state", "")
        elif signals.retest is not None:
            commit = signals.retest.commit
            await self._measure(cycle, signals, Phase.EXECUTE, "retest", f"run {commit[:12]} again", commit)
        else:
            await self._experiment(cycle, signals, records)
        return False

    async def _head(self) -> str:
        return (await self._deps.monitor.get_workspace(self._workspace_id)).git.head_commit

    async def _measure(
        self, cycle: int, signals: Signals, phase: Phase, hypothesis: str, action: str, commit: str
    ) -> None:
        """A cycle without THINK: the baseline, or a retest of the candidate being tested."""
        started = datetime.now(UTC)
        await self._handle.set_phase(phase, cycle, action)
        if not commit:
            await self._deps.monitor.reset_workspace(self._workspace_id, signals.best_commit or await self._head())
            commit = await self._head()
        end = await self._run_job(cycle)
        await self._reflect(
            cycle, signals, hypothesis, action, commit, end, started, tokens=0, baseline=phase is Phase.BASELINE
        )

    async def _experiment(self, cycle: int, signals: Signals, records: Sequence[CampaignRecord]) -> None:
        handle, started = self._handle, datetime.now(UTC)
        launched = _launched(records, cycle)
        if launched is not None:  # restarted after the change was committed: its experiment, not a new THINK
            end = await self._run_job(cycle)
            await self._reflect(
                cycle, signals, launched.text, launched.action, launched.commit, end, started, launched.tokens_used
            )
            return
        await handle.set_phase(Phase.THINK, cycle, "choosing the next hypothesis")
        # A redone THINK starts from the kept state: whatever a half-finished one changed is dropped.
        await self._deps.monitor.reset_workspace(self._workspace_id, signals.best_commit, remove_untracked=False)
        directives = await self._consume_directives(cycle, records)
        context = memory.think_context(self._spec.brief.goal + _brief_rules(self._spec), records, signals)
        context = _with_directives(context, directives)
        conversation_id = f"{self._id}-c{cycle}-{started.strftime('%H%M%S%f')}"
        think = ThinkContext(self, cycle, conversation_id)
        opening = [system(INSTRUCTIONS), user(context.render())]
        await self._deps.conversations.create(conversation_id, opening)
        agent = AgentRun(
            self._deps.model,
            THINK_TOOLS,
            self._deps.conversations,
            conversation_id,
            LoopLimits(max_turns=self._deps.settings.think_turns),
            LoopObserver(),
            agent="campaign",
        )
        failure = ""
        hypothesis = ""
        try:
            hypothesis = (await agent.run(think, history=list(opening))).strip()
        except Exception as error:  # the model failed: the cycle failed, the limiter backs off
            failure = f"THINK failed: {error}"
        tokens = agent.usage.input_tokens + agent.usage.output_tokens + think.tokens
        await handle.record_usage(tokens)
        hypothesis = hypothesis or "(no hypothesis stated)"
        action = "; ".join(think.changes) or "no change"
        commit = ""
        if not failure and not think.files:
            failure = "no file was changed: nothing to run"
        if not failure:
            await handle.set_phase(Phase.EXECUTE, cycle, hypothesis[:200])
            response = await self._deps.monitor.commit_workspace(
                self._workspace_id,
                f"campaign cycle {cycle}: {hypothesis[:200]}",
                request_id=f"{conversation_id}/commit",
            )
            commit = response.commit
        decision = Decision(cycle=cycle, text=hypothesis, commit=commit, action=action, tokens_used=tokens)
        await self.write(decision, f"c{cycle}/decision")
        if failure:
            end = _JobEnd("", JobState.UNKNOWN, None, None, failure)
            await self._reflect(cycle, signals, hypothesis, action, commit, end, started, tokens, failed=True)
            return
        end = await self._run_job(cycle)
        changed = tuple(sorted(think.files))
        await self._reflect(cycle, signals, hypothesis, action, commit, end, started, tokens, changed=changed)

    async def _consume_directives(self, cycle: int, records: Sequence[CampaignRecord]) -> tuple[Directive, ...]:
        pending = await self._handle.pending_directives()
        for directive in pending:
            await self.write(
                Directive(text=directive.text, request_id=directive.request_id), f"directive/{directive.request_id}"
            )
        consumed = await self._handle.consume_directives([d.request_id for d in pending], cycle)
        for directive in consumed:
            await self.write(
                DirectiveConsumed(request_id=directive.request_id, cycle=cycle), f"consumed/{directive.request_id}"
            )
        return tuple(Directive(text=d.text, request_id=d.request_id) for d in consumed)

    async def engineer(self, change: str, context: ThinkContext) -> str:
        """One engineer delegation in the campaign's workspace; what it did, for the leader."""
        settings = self._deps.settings
        result = await self._delegate(
            context,
            f"e{len(context.changes) + 1}",
            Role.ENGINEER,
            change,
            ("edit the workspace only; do not run the full experiment",),
            settings.engineer_turns,
            settings.engineer_timeout_seconds,
        )
        context.changes.append(change)
        context.files.update(result.files_changed)
        if not result.succeeded:
            return f"the engineer failed: {result.error_message}"
        files = ", ".join(result.files_changed) or "none"
        return f"done; files changed: {files}\n{result.summary}"

    async def research(self, objective: str, criteria: tuple[str, ...], context: ThinkContext) -> str:
        """One literature research delegation (its findings promoted to the campaign's thread); its summary."""
        settings = self._deps.settings
        context.researched += 1
        result = await self._delegate(
            context,
            f"r{context.researched}",
            Role.RESEARCHER,
            objective,
            criteria,
            settings.research_turns,
            settings.research_timeout_seconds,
        )
        if not result.succeeded:
            return f"the researcher failed: {result.error_message}"
        return f"done; findings promoted: {len(result.promoted)}\n{result.summary}"

    async def _delegate(
        self,
        context: ThinkContext,
        suffix: str,
        role: Role,
        objective: str,
        criteria: tuple[str, ...],
        max_turns: int,
        timeout_seconds: float,
    ) -> DelegationResult:
        """One worker delegation on the campaign's thread, its tokens counted in the cycle's (which the
        limiter bounds by the campaign's budgets)."""
        order = DelegationOrder(
            delegation_id=f"{context.attempt}-{suffix}",
            run_id=self._id,
            tool_call_id=current_call().id,
            scratchpad_thread_id=self._thread,
            objective=objective,
            criteria=criteria,
            input_refs=(),
            role=role,
            max_turns=max_turns,
            max_tokens=0,
            timeout_seconds=timeout_seconds,
            workspace_id=self._workspace_id if role is Role.ENGINEER else "",
        )

        async def on_turn(turn: int, max_turns: int, worker_id: str) -> None:
            return None

        result = await self._deps.delegations.run(order, deadline_seconds=timeout_seconds + 30, on_turn=on_turn)
        context.tokens += result.usage.input_tokens + result.usage.output_tokens
        return result

    # -- EXECUTE / WAIT --------------------------------------------------------------------------------

    def _submit_request(self, cycle: int) -> monitor_pb2.SubmitJobRequest:
        spec = self._spec
        experiment, metric = spec.experiment, spec.metric
        metric_spec = monitor_pb2.MetricSpec(
            name=metric.name,
            direction=monitor_pb2.METRIC_DIRECTION_MINIMIZE
            if metric.direction is Direction.MINIMIZE
            else monitor_pb2.METRIC_DIRECTION_MAXIMIZE,
        )
        if metric.log_regex:
            metric_spec.log_regex = metric.log_regex
        else:
            metric_spec.jsonl_file.path = metric.jsonl_path
            metric_spec.jsonl_file.key = metric.jsonl_key
        options = monitor_pb2.JobOptions(workspace_id=self._workspace_id, metrics=[metric_spec])
        if experiment.wall_clock_seconds:
            options.wall_clock_limit.FromSeconds(max(int(experiment.wall_clock_seconds), 1))
        if experiment.gpu_count or experiment.gpu_indices:
            options.gpus.count = experiment.gpu_count
            options.gpus.indices.extend(experiment.gpu_indices)
        request = monitor_pb2.SubmitJobRequest(request_id=f"{self._id}/c{cycle}/job", options=options)
        # In the workspace's root, on its host: the monitor places each kind of job there.
        if experiment.slurm is not None:
            request.slurm.script_path = experiment.slurm.script_path
            request.slurm.sbatch_args.extend(experiment.slurm.sbatch_args)
        elif spec.workspace.host:
            request.remote.argv.extend(experiment.argv)
        else:
            request.local.argv.extend(experiment.argv)
        return request

    async def _run_job(self, cycle: int) -> _JobEnd:
        """Launch the cycle's experiment (or find it again after a restart) and wait for its end: no model call."""
        monitor = self._deps.monitor
        began = time.monotonic()
        submitted = await monitor.submit_job(self._submit_request(cycle))
        job = submitted.job
        await self._handle.set_phase(Phase.WAITING, cycle, f"job {job.monitor_job_id}")
        status: monitor_pb2.JobStatus | None = None
        deadline = (self._spec.experiment.wall_clock_seconds or 30 * 24 * 3600.0) + 3600.0
        async for response in monitor.watch_job(
            job, deadline_seconds=deadline, poll_seconds=self._deps.settings.watch_poll_seconds
        ):
            status = response.status
            state = JOB_STATES.from_proto(status.state) or JobState.UNKNOWN
            progress = JobProgress(
                cycle=cycle,
                job=job_ref_from_proto(job),
                state=state,
                gpu_indices=tuple(submitted.gpu_indices),
                log_tail=tuple(status.log_tail)[-20:],
                metric_points=tuple(MetricPoint(p.name, p.value, int(p.step)) for p in response.metric_points),
            )
            await self._handle.emit(events.job_progress(progress))
        ended = JOB_STATES.from_proto(status.state) if status is not None else None
        state = ended or JobState.UNKNOWN
        exit_code = status.exit_code if status is not None and status.HasField("exit_code") else None
        value = None
        if status is not None and state is JobState.COMPLETED:
            for result in status.metrics:
                if result.name == self._spec.metric.name and result.state == monitor_pb2.METRIC_STATE_FOUND:
                    value = result.value
        detail = status.detail if status is not None else "the job's end was not reported"
        return _JobEnd(job.monitor_job_id, state, exit_code, value, detail, time.monotonic() - began)

    # -- REFLECT -------------------------------------------------------------------------------------

    async def _reflect(
        self,
        cycle: int,
        signals: Signals,
        hypothesis: str,
        action: str,
        commit: str,
        end: _JobEnd,
        started: datetime,
        tokens: int,
        *,
        baseline: bool = False,
        failed: bool = False,
        changed: tuple[str, ...] = (),
    ) -> None:
        handle, spec, monitor = self._handle, self._spec, self._deps.monitor
        await handle.set_phase(Phase.REFLECT, cycle, f"job {end.job_id} {end.state.value}")
        name = spec.metric.name
        if failed or end.value is None:
            verdict = Verdict.FAILED
            reason = end.detail or f"the job ended {end.state.value} without a value for {name}"
            if end.job_id and not failed:
                reason = f"the job ended {end.state.value} (exit code {end.exit_code}) without a value for {name}"
        elif baseline:
            verdict, reason = Verdict.BASELINE, f"baseline {name} {end.value:.6g}"
        else:
            judgement = signals.judge(commit, end.value)
            verdict, reason = judgement.verdict, judgement.reason
        record = LedgerRecord(
            cycle=cycle,
            hypothesis=hypothesis,
            action=action,
            commit=commit,
            job_id=end.job_id,
            job_state=end.state if end.job_id else None,
            exit_code=end.exit_code,
            metrics={name: end.value if verdict is not Verdict.FAILED else None},
            verdict=verdict,
            conclusion=reason,
            tokens_used=tokens,
            started_at=started,
            ended_at=datetime.now(UTC),
        )
        await self._scan(cycle, changed, end)
        kept = signals.best_commit
        if verdict in (Verdict.DISCARD, Verdict.FAILED) and kept and not baseline:
            await monitor.reset_workspace(self._workspace_id, kept, remove_untracked=True)
        if verdict is Verdict.FAILED and not baseline:
            await self.write(DeadEnd(cycle=cycle, approach=hypothesis, reason=reason), f"c{cycle}/dead-end")
        after = read_signals([*_ledger(await self.records()), record], spec.metric.goal, spec.signal_rules())
        progress = Progress(best_value=after.best, noise_floor=after.noise.floor if after.noise else None)
        await handle.record_ledger(record, progress)
        await self.write(record, f"c{cycle}/ledger")
        if baseline and after.noise is not None and not after.baseline_runs_needed:
            noise = after.noise
            said = f"noise floor {noise.floor:.6g} over {noise.runs} baseline runs (mean {noise.mean:.6g})"
            await handle.emit(events.signal(SignalKind.NOISE_FLOOR, said, noise.floor), key=f"c{cycle}/noise")
        if after.stagnant and not signals.stagnant:
            await handle.emit(
                events.signal(SignalKind.STAGNATION, after.describe().splitlines()[-1]), key=f"c{cycle}/stagnant"
            )
        if after.phase_gate_cleared and not signals.phase_gate_cleared and after.best is not None:
            await handle.emit(
                events.signal(SignalKind.PHASE_GATE, "the best clears the phase gate", after.best), key=f"c{cycle}/gate"
            )
        await self._export(cycle)

    async def _scan(self, cycle: int, changed: tuple[str, ...], end: _JobEnd) -> None:
        """Record and announce every rule of the brief or budget the cycle broke (by code, at no model cost)."""
        spec = self._spec
        rules = violations.ScanRules(
            protected_paths=spec.brief.protected_paths,
            metric_paths=(spec.metric.jsonl_path,) if spec.metric.jsonl_path else (),
            job_budget_seconds=spec.experiment.wall_clock_seconds or 0.0,
        )
        activity = violations.CycleActivity(cycle, changed, end.job_id, end.state if end.job_id else None, end.seconds)
        for index, found in enumerate(violations.scan_violations(activity, rules)):
            await self.write(found, f"c{cycle}/violation/{index}")
            await self._handle.emit(events.violation(found), key=f"c{cycle}/violation/{index}")

    async def _export(self, cycle: int) -> None:
        records = await self.records()
        for path, content in exports.workspace_exports(records).items():
            try:
                await self._deps.monitor.write_workspace_file(self._workspace_id, path, content)
            except grpc.aio.AioRpcError as error:
                if _transient(error):
                    raise
                # A copy for humans (the brief protects that path, say): the campaign goes on without it.
                log.warning("campaign %s: %s not exported: %s", self._id, path, _describe(error))


_TRANSIENT_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


def _transient(error: QuarryError | grpc.aio.AioRpcError) -> bool:
    if isinstance(error, grpc.aio.AioRpcError):
        return error.code() in _TRANSIENT_CODES
    return isinstance(error, Unavailable | DeadlineExceeded | ResourceExhausted)


def _describe(error: QuarryError | grpc.aio.AioRpcError) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return f"{type(error).__name__}: {error}"


def _launched(records: Sequence[CampaignRecord], cycle: int) -> Decision | None:
    """The cycle's committed change, when a THINK of it got that far."""
    for record in records:
        if isinstance(record, Decision) and record.cycle == cycle and record.commit:
            return record
    return None


def _ledger(records: Sequence[CampaignRecord]) -> list[LedgerRecord]:
    return [record for record in records if isinstance(record, LedgerRecord)]


def _brief_rules(spec: CampaignSpec) -> str:
    brief = spec.brief
    lines = [f"- {constraint}" for constraint in brief.constraints]
    if brief.editable_paths:
        lines.append("- edit only: " + ", ".join(brief.editable_paths))
    if brief.protected_paths:
        lines.append("- never edit: " + ", ".join(brief.protected_paths))
    return ("\n" + "\n".join(lines)) if lines else ""


def _with_directives(context: memory.ThinkContext, directives: tuple[Directive, ...]) -> memory.ThinkContext:
    """The context with the directives this THINK consumed (the store is their source, not the thread)."""
    return replace(context, directives=directives)
