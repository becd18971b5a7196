"""In-memory stand-ins for what the campaign loop reaches through its ports, so a cycle's decisions run in
milliseconds: the lab (a git workspace whose experiment's metric is a function of its files), the
campaign's scratchpad thread, the handle on the campaign's store, THINK, and the workers' delegations.

Each keeps what it was asked, for assertions. The process tests (tests/supervisor_svc/test_campaign_loop.py)
run the same loop over the real services.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from quarry.agent.usage import Usage
from quarry.compute import JobReport
from quarry.errors import AlreadyExists
from quarry.identity import Principal
from quarry.records.campaign import TrialRecord
from quarry.research_plane import Appended
from quarry.v1 import campaign_pb2
from quarry.vocabulary import (
    DelegationResult,
    Entry,
    EntryKind,
    JobLook,
    JobMetric,
    JobRef,
    JobState,
    MetricDirection,
    MetricPoint,
    Source,
    Tier,
)
from quarry.workspace import Committed, Experiment, GitState, Launched, Written
from supervisor_svc.campaigns.events import Event
from supervisor_svc.campaigns.memory import ThinkBriefing
from supervisor_svc.campaigns.spec import Brief, Budgets, CampaignSpec, Metric, Rules, Workspace
from supervisor_svc.campaigns.spec import Experiment as CampaignExperiment
from supervisor_svc.campaigns.state import (
    CampaignRecord,
    CampaignState,
    DirectiveRecord,
    DirectiveState,
    Phase,
    Progress,
)
from supervisor_svc.campaigns.store import CampaignLost
from supervisor_svc.campaigns.think import Thought
from supervisor_svc.runs.domain import DelegationOrder
from supervisor_svc.runs.worker_client import StartListener, TurnListener

CAMPAIGN_ID = "campaign-" + "0" * 32
CONFIG = "config.json"


def spec(*, budgets: Budgets | None = None, rules: Rules | None = None) -> CampaignSpec:
    return CampaignSpec(
        brief=Brief(goal="Lower the validation loss.", protected_paths=("train.py",)),
        workspace=Workspace(root="/srv/project"),
        metric=Metric("val_loss", MetricDirection.MINIMIZE, log_regex=r"val_loss=([0-9.]+)"),
        experiment=CampaignExperiment(argv=("python3", "train.py"), wall_clock_seconds=60.0),
        budgets=budgets or Budgets(),
        rules=rules or Rules(baseline_runs=2),
    )


# -- the lab ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How an experiment on some files ends: its metric (None: not printed) and its state."""

    value: float | None
    state: JobState = JobState.COMPLETED
    exit_code: int = 0
    detail: str = ""


def crash(detail: str = "exit code 1") -> Outcome:
    return Outcome(None, JobState.FAILED, 1, detail)


class FakeLab:
    """A workspace on a branch with commits, and jobs whose outcome `outcome` reads from its files."""

    workspace_id = "ws-fake"

    def __init__(self, outcome: Callable[[Mapping[str, str]], Outcome], files: Mapping[str, str]) -> None:
        self._outcome = outcome
        self.files = dict(files)
        self.branch_name = "main"
        self.snapshots: dict[str, dict[str, str]] = {"c0": dict(files)}
        self.head = "c0"
        self.commits: dict[str, str] = {}  # by request_id
        self.resets: list[tuple[str, bool]] = []
        self.exported: dict[str, str] = {}
        self.changed: dict[str, tuple[str, ...]] = {}  # what each commit changed
        self.launches: dict[str, tuple[Launched, Outcome]] = {}  # by request_id
        self.launched: list[Experiment] = []
        self.refusal: BaseException | None = None  # raised by the next open
        self.interruptions: dict[str, BaseException] = {}  # raised once by a launch of that request_id

    async def open(
        self, root: str, *, host: str, protected_paths: Sequence[str], request_id: str
    ) -> tuple[FakeLab, GitState]:
        refusal, self.refusal = self.refusal, None
        if refusal is not None:
            raise refusal
        return self, await self.git()

    async def git(self) -> GitState:
        return GitState(self.branch_name, self.head)

    async def branch(self, name: str, *, request_id: str) -> GitState:
        self.branch_name = name
        return await self.git()

    async def commit(self, message: str, *, request_id: str) -> Committed:
        """Nothing to commit when the files are as HEAD has them (as git status would say); else the paths
        that differ, however they came to."""
        if request_id not in self.commits:
            before = self.snapshots.get(self.head, {})
            if self.files == before:
                return Committed(self.head, changed=False)
            commit = f"c{len(self.snapshots)}"
            self.snapshots[commit] = dict(self.files)
            self.commits[request_id] = self.head = commit
            self.changed[commit] = tuple(
                sorted(path for path in {*before, *self.files} if before.get(path) != self.files.get(path))
            )
        commit = self.commits[request_id]
        return Committed(commit, changed=True, paths=self.changed[commit])

    async def reset(self, commit: str, *, remove_untracked: bool = False) -> GitState:
        self.resets.append((commit, remove_untracked))
        self.head, self.files = commit, dict(self.snapshots[commit])
        return await self.git()

    async def write(self, path: str, content: str) -> Written:
        created = path not in self.exported
        self.exported[path] = content
        return Written(len(content), created)

    async def launch(self, experiment: Experiment, *, request_id: str = "") -> Launched:
        """A repeated request_id gets its job back, as the monitor's does."""
        interruption = self.interruptions.pop(request_id, None)
        if interruption is not None:
            raise interruption
        if request_id not in self.launches:
            self.launched.append(experiment)
            job = JobRef("local", pid=1000 + len(self.launches), monitor_job_id=f"job-{len(self.launches) + 1}")
            self.launches[request_id] = (Launched(job, ()), self._outcome(self.files))
        return self.launches[request_id][0]

    async def watch(self, job: JobRef, *, deadline_seconds: float, poll_seconds: int = 2) -> AsyncIterator[JobReport]:
        outcome = next(o for launched, o in self.launches.values() if launched.job == job)
        yield JobReport(JobLook(JobState.RUNNING, log_tail=("training",)))
        metric = JobMetric("val_loss", outcome.value, outcome.value, int(outcome.value is not None))
        points = () if outcome.value is None else (MetricPoint("val_loss", outcome.value, 2),)
        look = JobLook(outcome.state, outcome.exit_code, outcome.detail, ("done",), (metric,))
        yield JobReport(look, metric_points=points)


# -- the campaign's thread -----------------------------------------------------------------------------


class FakeScratchpad:
    """The scratchpad as quarry.research_plane.ResearchPlane offers it, in memory: appends once per request_id."""

    def __init__(self) -> None:
        self.threads: dict[str, list[Entry]] = {}
        self._created: dict[str, str] = {}  # request_id by thread
        self._requests: dict[str, Entry] = {}
        self.reads = 0

    async def create_thread(self, thread_id: str, *, title: str, request_id: str) -> None:
        """A repeated request answers as the first did; another for the same thread is refused."""
        if self._created.setdefault(thread_id, request_id) != request_id:
            raise AlreadyExists(f"thread {thread_id} exists")
        self.threads.setdefault(thread_id, [])

    async def append(
        self,
        thread_id: str,
        *,
        kind: EntryKind,
        author: Principal,
        content: str,
        request_id: str,
        sources: Sequence[Source] = (),
    ) -> Appended:
        if request_id in self._requests:
            return Appended(self._requests[request_id], replayed=True)
        entries = self.threads.setdefault(thread_id, [])
        entry = Entry(thread_id, len(entries) + 1, kind, author, content, tuple(sources), datetime.now(UTC), request_id)
        entries.append(entry)
        self._requests[request_id] = entry
        return Appended(entry, replayed=False)

    async def read_all(self, thread_id: str, *, after_sequence_no: int = 0) -> list[Entry]:
        self.reads += 1
        return [entry for entry in self.threads.get(thread_id, []) if entry.sequence_no > after_sequence_no]

    def kinds(self, thread_id: str) -> list[EntryKind]:
        return [entry.kind for entry in self.threads[thread_id]]


# -- the campaign's store -----------------------------------------------------------------------------


class Stopped(Exception):
    """What FakeHandle.sleep raises, so a test sees the loop's first wait instead of sleeping through it."""


class FakeHandle:
    """supervisor_svc.campaigns.service.CampaignHandle in memory: what the loop told the campaign."""

    def __init__(self, campaign_spec: CampaignSpec, directives: Sequence[str] = ()) -> None:
        now = datetime.now(UTC)
        self.record = CampaignRecord(
            campaign_id=CAMPAIGN_ID,
            spec=campaign_spec,
            state=CampaignState.RUNNING,
            phase=Phase.IDLE,
            cycle=0,
            best_value=None,
            noise_floor=None,
            tokens=0,
            tokens_last_hour=0,
            cycles=0,
            branch="",
            scratchpad_thread_id=CAMPAIGN_ID,
            pause_reason="",
            end_reason="",
            pending_directives=len(directives),
            last_sequence_no=0,
            sleep_until=None,
            sleep_reason="",
            resume_time=None,
            create_time=now,
            update_time=now,
            end_time=None,
        )
        self.directives = [
            DirectiveRecord(CAMPAIGN_ID, f"directive-{n}", text, DirectiveState.PENDING, 0, now)
            for n, text in enumerate(directives, 1)
        ]
        self.phases: list[tuple[Phase, int, str]] = []
        self.events: list[campaign_pb2.CampaignEvent] = []
        self._keys: set[str] = set()
        self.rows: list[TrialRecord] = []
        self.progress: list[Progress] = []
        self.tokens = 0
        self.ended: tuple[CampaignState, str] | None = None  # finished (COMPLETED, FAILED) or PAUSED
        self.slept: list[str] = []

    @property
    def campaign_id(self) -> str:
        return CAMPAIGN_ID

    @property
    def verdicts(self) -> list[str]:
        return [row.verdict.value for row in self.rows]

    async def current(self) -> CampaignRecord:
        return self.record

    async def set_phase(self, phase: Phase, cycle: int, message: str = "") -> None:
        self.phases.append((phase, cycle, message))

    async def emit(self, *batch: Event, key: str = "") -> bool:
        if key and key in self._keys:
            return False
        self._keys.add(key)
        for event in batch:
            stored = event.stored(CAMPAIGN_ID, len(self.events) + 1, datetime.now(UTC))
            self.events.append(campaign_pb2.CampaignEvent.FromString(stored))
        return True

    def signals(self) -> list[campaign_pb2.CampaignSignal]:
        return [event.signal for event in self.events if event.HasField("signal")]

    async def record_usage(self, tokens: int) -> None:
        self.tokens += tokens

    async def record_trial(self, record: TrialRecord, progress: Progress | None = None) -> bool:
        if any(row.cycle == record.cycle for row in self.rows):
            return False
        self.rows.append(record)
        self.progress.append(progress or Progress())
        return True

    async def sleep(self, until: datetime, reason: str) -> None:
        self.slept.append(reason)
        raise Stopped(reason)

    async def pending_directives(self) -> list[DirectiveRecord]:
        return [d for d in self.directives if d.state is DirectiveState.PENDING]

    async def consume_directives(self, request_ids: Sequence[str], cycle: int) -> list[DirectiveRecord]:
        consumed = [d for d in self.directives if d.request_id in request_ids and d.state is DirectiveState.PENDING]
        self.directives = [
            replace(d, state=DirectiveState.CONSUMED, consumed_cycle=cycle) if d in consumed else d
            for d in self.directives
        ]
        return consumed

    async def pause(self, reason: str) -> None:
        self.ended = (CampaignState.PAUSED, reason)

    async def finish(self, state: CampaignState, reason: str) -> None:
        if self.ended is not None:
            raise CampaignLost(CAMPAIGN_ID)
        self.ended = (state, reason)


# -- THINK ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One scripted THINK: the hypothesis and the files its engineer writes (none: it changed nothing)."""

    hypothesis: str
    files: Mapping[str, str] = field(default_factory=dict)
    tokens: int = 100
    failure: str = ""  # the model failed
    by_command: bool = False  # the engineer changed the files through run_command: it reports no file written


class ScriptedThinking:
    """THINK as its outcome: each call takes the next Change and makes its edits in the lab."""

    def __init__(self, lab: FakeLab, *changes: Change) -> None:
        self._lab = lab
        self._changes = deque(changes)
        self.briefings: list[ThinkBriefing] = []
        self.attempts: list[str] = []
        self.tokens_left: list[int | None] = []  # what each THINK was told the cycle may spend

    async def think(
        self, cycle: int, attempt: str, briefing: ThinkBriefing, workspace_id: str, tokens_left: int | None = None
    ) -> Thought:
        self.briefings.append(briefing)
        self.tokens_left.append(tokens_left)
        self.attempts.append(attempt)
        change = self._changes.popleft()
        self._lab.files.update(change.files)
        written = () if change.by_command else tuple(sorted(change.files))
        return Thought(change.hypothesis, (change.hypothesis,), written, change.tokens, change.failure)


# -- the workers --------------------------------------------------------------------------------------


class FakeDelegations:
    """supervisor_svc.worker_client.DelegationClient in memory: each order succeeds after `seconds`, as worker
    w1 on the worker tier, having changed `files` (an engineer's) and promoted `promoted` entries."""

    def __init__(self, *, seconds: float = 0.0, files: tuple[str, ...] = (), promoted: tuple[int, ...] = ()) -> None:
        self._seconds = seconds
        self._files = files
        self._promoted = promoted
        self.orders: list[DelegationOrder] = []
        self.running = 0
        self.most_at_once = 0

    async def run(
        self,
        order: DelegationOrder,
        *,
        deadline_seconds: float,
        on_turn: TurnListener,
        on_started: StartListener | None = None,
    ) -> DelegationResult:
        self.orders.append(order)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            if on_started is not None:
                await on_started("w1", Tier.WORKER, "scripted")
            await on_turn(1, order.max_turns or 10, "w1")
            await asyncio.sleep(self._seconds)
        finally:
            self.running -= 1
        return DelegationResult(
            delegation_id=order.delegation_id,
            tool_call_id=order.tool_call_id,
            summary=f"did: {order.objective}",
            promoted=self._promoted,
            turns=1,
            usage=Usage(input_tokens=300, output_tokens=200),
            worker_id="w1",
            files_changed=self._files if order.workspace_id else (),
            tier=Tier.WORKER,
            model="scripted",
        )
