"""The campaign loop: BASELINE, then THINK -> EXECUTE -> WAIT -> REFLECT, one cycle at a time.

The loop is code; the model only thinks (think.py). Each cycle reads its state once (the campaign as
stored and the records on its thread), lets the limiter and the signals say what comes next, has
THINK choose a change, commits it, runs the experiment and waits for it with no model call at all
(experiment.py), then writes what REFLECT concluded (reflect.py, pure) once: the records on the
thread, the trial row in the campaign's store, the events, and the exported files.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import grpc
from opentelemetry import context as otel_context

from quarry.agent.conversation import ConversationStore
from quarry.agent.model import ModelClient
from quarry.clients.monitor import MonitorClient
from quarry.errors import QuarryError, ServiceError
from quarry.records.campaign import CampaignRecord, Decision, Directive, DirectiveConsumed, TrialRecord
from quarry.records.signals import Signals, read_signals
from quarry.research_plane import ResearchPlane
from quarry.telemetry import tracer
from supervisor_svc.campaigns import exports, limiter, memory
from supervisor_svc.campaigns.experiment import GpuWait, run_experiment
from supervisor_svc.campaigns.ports import DrivenCampaign, Lab, LabOpener, monitor_lab
from supervisor_svc.campaigns.reflect import JobEnd, ReflectInput, Reflection, Trial, reflect
from supervisor_svc.campaigns.report import Reports, at_end
from supervisor_svc.campaigns.service import CampaignHandle, CampaignLoopFactory
from supervisor_svc.campaigns.spec import CampaignSpec
from supervisor_svc.campaigns.state import CampaignState, Phase, branch_name
from supervisor_svc.campaigns.think import Thinker, Thinking, ThinkSettings
from supervisor_svc.campaigns.thread import CampaignThread
from supervisor_svc.runs.worker_client import DelegationClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopSettings:
    think: ThinkSettings = field(default_factory=ThinkSettings)
    # How often the monitor reports a running job (seconds); the wait costs no model call.
    watch_poll_seconds: int = 2
    # After a failed step (the monitor unreachable), wait this long before the cycle is tried again.
    retry_seconds: float = 5.0
    # While other jobs hold every GPU the experiment asks for.
    gpu_wait: GpuWait = field(default_factory=GpuWait)


@dataclass(frozen=True)
class LoopDependencies:
    model: ModelClient
    conversations: ConversationStore
    scratchpad: ResearchPlane
    delegations: DelegationClient
    monitor: MonitorClient
    settings: LoopSettings = field(default_factory=LoopSettings)


def loop_factory(deps: LoopDependencies) -> CampaignLoopFactory:
    open_lab = monitor_lab(deps.monitor)
    reports = Reports(deps.scratchpad, deps.delegations)

    def make(handle: CampaignHandle) -> CampaignLoop:
        campaign_id = handle.campaign_id
        thread = CampaignThread(deps.scratchpad, campaign_id, handle.record.scratchpad_thread_id or campaign_id)
        thinker = Thinker(
            campaign_id, thread, deps.scratchpad, deps.model, deps.conversations, deps.delegations, deps.settings.think
        )
        return CampaignLoop(handle, open_lab, thread, thinker, deps.settings, reports)

    return make


class CampaignLoop:
    def __init__(
        self,
        handle: DrivenCampaign,
        open_lab: LabOpener,
        thread: CampaignThread,
        thinker: Thinking,
        settings: LoopSettings,
        reports: Reports | None = None,
    ) -> None:
        self._handle = handle
        self._reports = reports
        self._open_lab = open_lab
        self._thread = thread
        self._thinker = thinker
        self._settings = settings
        self._spec: CampaignSpec = handle.record.spec
        self._id = handle.campaign_id
        self._branch = handle.record.branch or branch_name(handle.campaign_id)
        self._opened: Lab | None = None

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
            except QuarryError as error:
                if not _transient(error):  # refused (a root not allowed, submission off...): a human must look
                    await self._handle.pause(f"a service refused the campaign: {_describe(error)}")
                    return
                # The monitor, a worker or the scratchpad is unreachable or busy: the step is redone, idempotently.
                log.warning("campaign %s: a step failed, retrying: %s", self._id, _describe(error))
                await asyncio.sleep(self._settings.retry_seconds)

    async def _set_up(self) -> bool:
        """Open the workspace on the campaign's branch and the campaign's thread; False when the workspace is on
        another branch (someone checked one out)."""
        spec = self._spec
        await self._thread.create(spec.title or spec.brief.goal[:200])
        lab, git = await self._open_lab(
            spec.workspace.root,
            host=spec.workspace.host,
            protected_paths=spec.brief.protected_paths,
            request_id=f"{self._id}/open",
        )
        self._opened = lab
        if git.branch != self._branch:
            # Made once (a repeat answers the first result); the loop never leaves the branch afterwards.
            git = await lab.branch(self._branch, request_id=f"{self._id}/branch")
        return git.branch == self._branch

    @property
    def _lab(self) -> Lab:
        if self._opened is None:
            raise RuntimeError("the lab is opened before the first cycle")
        return self._opened

    async def _step(self) -> bool:
        """One cycle, or one wait; True once the campaign ended or paused."""
        handle, spec = self._handle, self._spec
        current = await handle.current()
        trials = _trials(await self._thread.read())
        signals = read_signals(trials, spec.metric.goal, spec.signal_rules())
        if signals.phase_gate_cleared and spec.rules.stop_at_phase_gate:
            await self._complete(f"the phase gate is cleared: {signals.best:.6g}")
            return True
        history = [limiter.CycleCost.of(record) for record in trials]
        now = datetime.now(UTC)
        admission = limiter.admit(history, now, spec.limits(), failures_since=current.resume_time)
        if admission.step is limiter.Step.DONE:
            await self._complete(admission.reason)
            return True
        if admission.step is limiter.Step.PAUSE:
            await handle.pause(admission.reason)
            return True
        if admission.step is limiter.Step.SLEEP:
            await handle.sleep(now + timedelta(seconds=admission.sleep_seconds), admission.reason)
            await asyncio.sleep(admission.sleep_seconds)
            return False
        cycle = len(trials) + 1
        kind = "baseline" if signals.baseline_runs_needed else "retest" if signals.retest is not None else "experiment"
        # One trace per cycle, whatever context the loop's task was started in (a StartCampaign call's, say).
        attributes: dict[str, str | int] = {
            "quarry.campaign_id": self._id,
            "quarry.cycle": cycle,
            "quarry.cycle.kind": kind,
        }
        with tracer.start_as_current_span("campaign cycle", context=otel_context.Context(), attributes=attributes):
            if signals.baseline_runs_needed:
                action = "run the unchanged kept state"
                await self._measure(cycle, signals, trials, Phase.BASELINE, "baseline", action, "")
            elif signals.retest is not None:
                commit = signals.retest.commit
                action = f"run {commit[:12]} again"
                await self._measure(cycle, signals, trials, Phase.EXECUTE, "retest", action, commit)
            else:
                await self._experiment(cycle, signals, trials)
        return False

    async def _complete(self, reason: str) -> None:
        """End the campaign, its report written first when the spec asks for one."""
        if self._spec.write_report_at_end and self._reports is not None:
            current = await self._handle.current()
            await self._handle.set_phase(Phase.REFLECT, current.cycle, "writing the campaign's report")
            attributes = {"quarry.campaign_id": self._id}
            with tracer.start_as_current_span("campaign report", context=otel_context.Context(), attributes=attributes):
                report, written = await self._reports.write(self._id, self._spec, self._thread, at_end(self._id))
            if written:
                await self._handle.record_usage(report.tokens_used)
        await self._handle.finish(CampaignState.COMPLETED, reason)

    async def _measure(
        self,
        cycle: int,
        signals: Signals,
        trials: Sequence[TrialRecord],
        phase: Phase,
        hypothesis: str,
        action: str,
        commit: str,
    ) -> None:
        """A cycle without THINK: the baseline, or a retest of the candidate being tested."""
        started = datetime.now(UTC)
        await self._handle.set_phase(phase, cycle, action)
        if not commit:
            kept = signals.best_commit or (await self._lab.git()).head_commit
            commit = (await self._lab.reset(kept)).head_commit
        end = await self._run_job(cycle)
        trial = Trial(cycle, hypothesis, action, commit, started, tokens=0, baseline=phase is Phase.BASELINE)
        await self._reflect(signals, trials, trial, end)

    async def _experiment(self, cycle: int, signals: Signals, trials: Sequence[TrialRecord]) -> None:
        handle, started = self._handle, datetime.now(UTC)
        launched = _launched(self._thread.records, cycle)
        if launched is not None:  # restarted after the change was committed: its experiment, not a new THINK
            end = await self._run_job(cycle)
            trial = Trial(cycle, launched.text, launched.action, launched.commit, started, launched.tokens_used)
            await self._reflect(signals, trials, trial, end)
            return
        await handle.set_phase(Phase.THINK, cycle, "choosing the next hypothesis")
        # A redone THINK starts from the kept state: whatever a half-finished one changed is dropped.
        await self._lab.reset(signals.best_commit, remove_untracked=False)
        directives = await self._consume_directives(cycle)
        briefing = memory.think_briefing(
            self._spec.brief.goal + _brief_rules(self._spec), self._thread.records, signals
        )
        # The directives this THINK consumed (the store is their source, not the thread).
        briefing = replace(briefing, directives=directives)
        attempt = _attempt(self._id, cycle, started)
        left = limiter.tokens_left(
            [limiter.CycleCost.of(record) for record in trials], datetime.now(UTC), self._spec.limits()
        )
        with tracer.start_as_current_span("campaign think", attributes={"quarry.conversation_id": attempt}):
            thought = await self._thinker.think(cycle, attempt, briefing, self._lab.workspace_id, tokens_left=left)
        await handle.record_usage(thought.tokens)
        action = "; ".join(thought.changes) or "no change"
        commit, failure, changed = "", thought.failure, thought.files
        if not failure:
            await handle.set_phase(Phase.EXECUTE, cycle, thought.hypothesis[:200])
            message = f"campaign cycle {cycle}: {thought.hypothesis[:200]}"
            committed = await self._lab.commit(message, request_id=f"{attempt}/commit")
            # The workspace's own state says whether anything changed, however it was changed: nothing to
            # commit is nothing to run, and no job is launched to judge the kept commit against itself.
            commit, failure = (committed.commit, "") if committed.changed else ("", NO_CHANGE)
            changed = committed.paths
        decision = Decision(
            cycle=cycle, text=thought.hypothesis, commit=commit, action=action, tokens_used=thought.tokens
        )
        await self._thread.write(decision, f"c{cycle}/decision")
        trial = Trial(cycle, thought.hypothesis, action, commit, started, thought.tokens)
        if failure:
            await self._reflect(signals, trials, replace(trial, failed=True), JobEnd.not_run(failure))
            return
        end = await self._run_job(cycle)
        # What the commit changed, as git says (a command's edits included), is what the violation scan checks.
        await self._reflect(signals, trials, replace(trial, changed=changed or thought.files), end)

    async def _consume_directives(self, cycle: int) -> tuple[Directive, ...]:
        pending = await self._handle.pending_directives()
        for directive in pending:
            await self._thread.write(
                Directive(text=directive.text, request_id=directive.request_id), f"directive/{directive.request_id}"
            )
        consumed = await self._handle.consume_directives([d.request_id for d in pending], cycle)
        for directive in consumed:
            await self._thread.write(
                DirectiveConsumed(request_id=directive.request_id, cycle=cycle), f"consumed/{directive.request_id}"
            )
        return tuple(Directive(text=d.text, request_id=d.request_id) for d in consumed)

    async def _run_job(self, cycle: int) -> JobEnd:
        settings = self._settings
        with tracer.start_as_current_span("campaign experiment") as span:
            end = await run_experiment(self._lab, self._handle, cycle, settings.watch_poll_seconds, settings.gpu_wait)
            span.set_attributes({"quarry.job_id": end.job_id, "quarry.job.state": end.state.value})
            return end

    async def _reflect(self, signals: Signals, trials: Sequence[TrialRecord], trial: Trial, end: JobEnd) -> None:
        """REFLECT: its conclusions, written once."""
        with tracer.start_as_current_span("campaign reflect") as span:
            await self._handle.set_phase(Phase.REFLECT, trial.cycle, f"job {end.job_id} {end.state.value}")
            now = datetime.now(UTC)
            reflection = reflect(ReflectInput(self._spec, signals, trials, trial, end, now))
            span.set_attribute("quarry.verdict", reflection.row.verdict.value)
            await self._write(reflection)

    async def _write(self, reflection: Reflection) -> None:
        handle, row = self._handle, reflection.row
        for record in reflection.records:
            await self._thread.write(record.item, record.key)
        for event in reflection.announced:
            await handle.emit(event.item, key=event.key)
        if reflection.reset_to:
            await self._lab.reset(reflection.reset_to, remove_untracked=True)
        await handle.record_trial(row, reflection.progress)
        await self._thread.write(row, f"c{row.cycle}/ledger")  # the key the thread's trials have always had
        for event in reflection.signalled:
            await handle.emit(event.item, key=event.key)
        await self._export()

    async def _export(self) -> None:
        for path, content in exports.workspace_exports(self._thread.records).items():
            try:
                await self._lab.write(path, content)
            except QuarryError as error:
                if _transient(error):
                    raise
                # A copy for humans (the brief protects that path, say): the campaign goes on without it.
                log.warning("campaign %s: %s not exported: %s", self._id, path, _describe(error))


# Why a cycle whose THINK left the workspace as it was ran no job (its next THINK reads it on the ledger).
NO_CHANGE = "no change: the workspace was left as it was (git status: nothing to commit), so nothing was run"
# A service unreachable or busy: the step is redone; any other refusal needs a human.
_TRANSIENT_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


def _transient(error: QuarryError) -> bool:
    return error.code in _TRANSIENT_CODES


def _describe(error: QuarryError) -> str:
    if isinstance(error, ServiceError):  # as the service answered: its status and its words
        return f"{error.code.name}: {error.message}"
    return f"{type(error).__name__}: {error}"


def _attempt(campaign_id: str, cycle: int, started: datetime) -> str:
    """One THINK's id (its conversation's): a THINK redone after a restart is another attempt."""
    return f"{campaign_id}-c{cycle}-{started.strftime('%H%M%S%f')}"


def _launched(records: Sequence[CampaignRecord], cycle: int) -> Decision | None:
    """The cycle's committed change, when a THINK of it got that far."""
    for record in records:
        if isinstance(record, Decision) and record.cycle == cycle and record.commit:
            return record
    return None


def _trials(records: Sequence[CampaignRecord]) -> list[TrialRecord]:
    return [record for record in records if isinstance(record, TrialRecord)]


def _brief_rules(spec: CampaignSpec) -> str:
    brief = spec.brief
    lines = [f"- {constraint}" for constraint in brief.constraints]
    if brief.editable_paths:
        lines.append("- edit only: " + ", ".join(brief.editable_paths))
    if brief.protected_paths:
        lines.append("- never edit: " + ", ".join(brief.protected_paths))
    return ("\n" + "\n".join(lines)) if lines else ""
