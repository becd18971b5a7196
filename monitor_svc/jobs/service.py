"""The jobs the monitor starts and watches, whatever runs them: submission, records, restarts, watches.

Every job SubmitJob starts has a durable record (records.py) and a supervising task of the
monitor's (supervision.py). A request_id names one job, across restarts too. Watches of such a job
report what the supervisor saw; a watch of any other job looks at it through its kind's executor.
A monitor that restarts reloads the records and supervises the jobs still running again, as
processes it did not start (a process's start time tells it from a later one with its pid).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

from monitor_svc.gpus import GpuRequest, GpuSampler, choose_gpus
from monitor_svc.idempotency import Once, check_request_id
from monitor_svc.jobs.executor import INTERRUPTED, JobExecutor, NotStarted, Prepared, StartUnknown, Watch, log_host
from monitor_svc.jobs.local import LogLimits
from monitor_svc.jobs.records import JobRecord, JobRecords, new_job_id
from monitor_svc.jobs.registry import executors
from monitor_svc.jobs.sandbox import Sandbox
from monitor_svc.jobs.slurm import SlurmLimits
from monitor_svc.jobs.spec import JobKind, JobObservation, JobOptions, JobRequest
from monitor_svc.jobs.supervision import Job, Supervision, Supervisor
from monitor_svc.logs import LogCursor, Logs
from monitor_svc.metrics import CompiledMetric, MetricTracker, compile_metrics
from monitor_svc.ssh import SshHosts
from monitor_svc.validation import refuse_nul, require_job_kind
from monitor_svc.workspaces.operations import Workspaces
from quarry.errors import ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument, NotFound, PermissionDenied
from quarry.vocabulary import JobRef, JobState

log = logging.getLogger(__name__)

_SUPERVISION = Supervision()  # the default


class Jobs:
    def __init__(
        self,
        hosts: SshHosts,
        gpus: GpuSampler,
        jobs_dir: Path,
        records: JobRecords,
        limits: SlurmLimits,
        log_roots: Sequence[str] = (),
        *,
        workspaces: Workspaces,
        sandbox: Sandbox,
        allow_submission: bool = False,
        supervision: Supervision = _SUPERVISION,
        log_limits: LogLimits | None = None,
    ) -> None:
        self._gpus = gpus
        self._allow_submission = allow_submission
        self._records = records
        self._logs = Logs(hosts, (str(jobs_dir), *log_roots))
        self._executors = executors(hosts, self._logs, workspaces, jobs_dir, limits, sandbox, log_limits)
        self._supervisor = Supervisor(self._executors, self._logs, records, supervision)
        self._jobs: dict[str, Job] = {}  # by monitor_job_id
        self._submissions = Once(conflict="already started a different job")
        self._reserving: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)  # per host: GPU choice

    # -- lifecycle -------------------------------------------------------------------------------

    async def resume(self) -> None:
        """Reload the records of the jobs this monitor started, and supervise those still running again."""
        for record in await self._records.load():
            try:
                metrics = compile_metrics(record.metrics, working_directory=record.working_directory)
            except InvalidArgument as error:
                log.warning("job %s: its metrics can no longer be read: %s", record.monitor_job_id, error)
                metrics = ()
            observation = JobObservation(record.state, record.exit_code, record.detail, metrics=tuple(record.results))
            job = self._register(Job(record, MetricTracker(metrics), observation))
            if record.state.ended:
                continue
            if not record.pid and not record.slurm_job_id:
                await self._supervisor.end(job, JobObservation(JobState.UNKNOWN, detail=INTERRUPTED))
                continue
            self._supervisor.supervise(job)

    async def close(self) -> None:
        """Stop supervising; the jobs run on, and a monitor that starts again takes them up."""
        tasks = [job.supervisor for job in self._jobs.values() if job.supervisor is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- requests -------------------------------------------------------------------------------

    def check_ref(self, ref: JobRef) -> None:
        """A job reference a watch can follow: a process id, or a Slurm job id, and the host where needed."""
        kind = JobKind(require_job_kind(ref.kind, tuple(JobKind)))
        prefix = f"job.{kind}"
        refuse_nul({"job.log_path": ref.log_path, f"{prefix}.host": ref.host, f"{prefix}.job_id": ref.job_id})
        self._executors[kind].check_ref(ref)

    async def submit(self, kind: JobKind, request: JobRequest, options: JobOptions, request_id: str) -> JobRecord:
        # A job runs as the monitor's user; a deployment that wants that says so.
        if not self._allow_submission:
            raise PermissionDenied(
                "this monitor does not run jobs; set QUARRY_MONITOR_ALLOW_JOB_SUBMISSION=true to allow SubmitJob",
                reason=ErrorReason.JOB_SUBMISSION_DISABLED,
            )
        if options.isolate_network and kind is not JobKind.LOCAL:
            raise InvalidArgument([FieldViolation("options.isolate_network", "only a local job runs in the sandbox")])
        executor = self._executors[kind]
        prepared = await executor.prepare(request, options, request_id)
        # Idempotent by request_id, across restarts too: a repeat gets the job the first call started, even if
        # that caller left; a request_id used for another job is refused.
        check_request_id(request_id, when_missing="required: a retry must not start a second job")
        digest = hashlib.sha256(json.dumps(prepared.payload, sort_keys=True).encode()).hexdigest()
        job = await self._submissions.once(
            request_id, digest, lambda: self._start(executor, prepared, options, request_id, digest)
        )
        return job.record

    async def _start(
        self, executor: JobExecutor, prepared: Prepared, options: JobOptions, request_id: str, digest: str
    ) -> Job:
        record = JobRecord(
            new_job_id(),
            request_id,
            digest,
            executor.kind,
            host=prepared.host,
            argv=list(prepared.argv),
            working_directory=prepared.working_directory,
            environment_names=sorted(options.environment),
            wall_clock_limit=options.wall_clock_limit,
            metrics=list(options.metrics),
            workspace_id=options.workspace_id,
            detail="starting",
        )
        held: list[Job] = []

        @contextlib.asynccontextmanager
        async def hold(gpus: GpuRequest | None) -> AsyncIterator[None]:
            async with self._reserving[record.host] if gpus is not None else contextlib.nullcontext():
                record.gpus = list(await self._reserve(record.host, gpus)) if gpus is not None else []
                job = await self._pending(record, prepared.metrics)
                held.append(job)
                try:
                    yield
                except NotStarted as failed:
                    await self._abandon(job)
                    raise failed.error from failed
                except StartUnknown as failed:
                    await self._supervisor.end(job, JobObservation(JobState.UNKNOWN, detail=failed.detail))
                    raise failed.error from failed

        started = await prepared.start(record, hold)
        [job] = held
        record.state, record.detail, record.started_at = started.state, started.detail, time.time()
        job.update(started)
        await self._supervisor.save(record)
        self._supervisor.supervise(job)
        return job

    def _register(self, job: Job) -> Job:
        self._jobs[job.record.monitor_job_id] = job
        self._submissions.remember(job.record.request_id, job.record.digest, job)
        return job

    async def _reserve(self, host: str, request: GpuRequest) -> tuple[int, ...]:
        """GPUs for a new job on `host` ("" for this machine), none held by a running job of this monitor."""
        if not request.wanted:
            return ()
        gpus, reason = await self._gpus.sample(host)
        reserved = {
            index
            for job in self._jobs.values()
            if job.record.host == host and not job.observation.state.ended
            for index in job.record.gpus  # none for a Slurm job: Slurm picks them
        }
        return choose_gpus(gpus, reason, reserved, request, host or "this machine")

    async def _pending(self, record: JobRecord, metrics: tuple[CompiledMetric, ...]) -> Job:
        """Record the job before it starts (a monitor stopping meanwhile must not start it twice); it now holds
        its GPUs."""
        try:
            await self._records.save(record)
        except OSError as error:
            raise FailedPrecondition(
                f"cannot write the job's record: {error.strerror}", reason=ErrorReason.JOB_NOT_STARTED
            ) from error
        return self._register(Job(record, MetricTracker(metrics), JobObservation(JobState.PENDING, detail="starting")))

    async def _abandon(self, job: Job) -> None:
        """It did not start: no record, and a retry may try again."""
        self._jobs.pop(job.record.monitor_job_id, None)
        self._submissions.forget(job.record.request_id)
        try:
            await self._records.delete(job.record)
        except OSError as error:
            log.error("cannot remove the record of job %s: %s", job.record.monitor_job_id, error)

    # -- watching ------------------------------------------------------------------------------------

    async def watch(self, ref: JobRef, interval: float, tail_lines: int) -> AsyncIterator[JobObservation]:
        """The job's state and the last log lines, then every change (state, new lines, metric values) until it
        ends. A job the monitor started (ref.monitor_job_id) is reported as its supervisor sees it."""
        if ref.monitor_job_id:
            async for observation in self._watch_job(self._job_for(ref), interval, tail_lines):
                yield observation
            return
        # Only under the configured roots (the monitor's job directory, a host's log_roots).
        self._logs.check_path(ref.log_path, log_host(ref), "job.log_path")
        watch = Watch.of(ref)
        executor = self._executors[JobKind(ref.kind)]
        previous: tuple[JobState, int | None] | None = None
        while True:
            observation = await executor.observe(watch)
            ended = observation.state.ended
            lines = await self._logs.lines(watch.cursor, tail_lines if previous is None else 0, final=ended)
            observation = replace(observation, new_log_lines=tuple(lines))
            current = (observation.state, observation.exit_code)
            if previous is None or lines or current != previous:
                yield observation
            previous = current
            if ended:
                return
            await asyncio.sleep(interval)

    def _job_for(self, ref: JobRef) -> Job:
        job = self._jobs.get(ref.monitor_job_id)
        if job is None:
            raise NotFound("job", ref.monitor_job_id, field="job.monitor_job_id")
        known = job.record.ref
        if ref.kind and (
            (ref.kind, ref.pid, ref.host, ref.job_id) != (known.kind, known.pid, known.host, known.job_id)
            or ref.log_path not in ("", known.log_path)
        ):
            raise InvalidArgument([FieldViolation("job", f"is not the job {ref.monitor_job_id} names")])
        return job

    async def _watch_job(self, job: Job, interval: float, tail_lines: int) -> AsyncIterator[JobObservation]:
        cursor = LogCursor(job.record.log_path, job.record.host)
        sent = 0  # the last metric point reported
        previous: tuple[JobState, int | None] | None = None
        while True:
            observation, changed = job.observation, job.changed
            ended = observation.state.ended
            lines = await self._logs.lines(cursor, tail_lines if previous is None else 0, final=ended)
            points, sent = job.tracker.points_after(sent)
            current = (observation.state, observation.exit_code)
            if previous is None or lines or points or current != previous:
                yield replace(observation, new_log_lines=tuple(lines), metric_points=points)
            previous = current
            if ended:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), interval)
