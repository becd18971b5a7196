"""EXECUTE and WAIT: launch the cycle's experiment through the lab, and wait for its end with no model call.

A job is launched with a request_id per cycle and run, so a loop that restarts mid-cycle gets the
job it launched back from the monitor instead of launching a second one. While it runs, each report
becomes a job-progress event; its end gives the metric the monitor parsed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from quarry.errors import ErrorReason, FailedPrecondition, QuarryError
from quarry.vocabulary import JobLook, JobState
from quarry.workspace import Experiment, Launched, MetricWanted, SlurmScript
from supervisor_svc.campaigns import events
from supervisor_svc.campaigns.ports import DrivenCampaign, Lab
from supervisor_svc.campaigns.reflect import JobEnd
from supervisor_svc.campaigns.spec import CampaignSpec
from supervisor_svc.campaigns.state import JobProgress, Phase

# However long an experiment may run, the wait for it gives up an hour past its limit (30 days without one).
_UNBOUNDED_SECONDS = 30 * 24 * 3600.0
_WAIT_SLACK_SECONDS = 3600.0
_PROGRESS_LOG_LINES = 20


def experiment_of(spec: CampaignSpec) -> Experiment:
    """The campaign's experiment as a job in its workspace, measuring the campaign's metric."""
    experiment, metric = spec.experiment, spec.metric
    slurm = experiment.slurm
    return Experiment(
        "",
        experiment.wall_clock_seconds or 0.0,
        argv=experiment.argv,
        slurm=SlurmScript(slurm.script_path, slurm.sbatch_args) if slurm is not None else None,
        gpu_count=experiment.gpu_count,
        gpu_indices=experiment.gpu_indices,
        isolate_network=experiment.isolate_network,
        metrics=(
            MetricWanted(metric.name, metric.goal.direction, metric.log_regex, metric.jsonl_path, metric.jsonl_key),
        ),
    )


@dataclass(frozen=True)
class GpuWait:
    """How a cycle waits for GPUs other jobs hold: asking again this often, for at most this long."""

    poll_seconds: float = 1.0
    limit_seconds: float = 24 * 3600.0


async def run_experiment(
    lab: Lab, handle: DrivenCampaign, cycle: int, poll_seconds: int, gpu_wait: GpuWait = GpuWait()
) -> JobEnd:
    """Launch the cycle's experiment (or find it again after a restart) and wait for its end: no model call."""
    spec = handle.record.spec
    began = time.monotonic()
    launched = await _launch(lab, handle, cycle, experiment_of(spec), gpu_wait)
    job = launched.job
    await handle.set_phase(Phase.WAITING, cycle, f"job {job.monitor_job_id}")
    last: JobLook | None = None
    deadline = (spec.experiment.wall_clock_seconds or _UNBOUNDED_SECONDS) + _WAIT_SLACK_SECONDS
    async for report in lab.watch(job, deadline_seconds=deadline, poll_seconds=poll_seconds):
        last = report.look
        progress = JobProgress(
            cycle=cycle,
            job=job,
            state=last.state,
            gpu_indices=launched.gpus,
            log_tail=last.log_tail[-_PROGRESS_LOG_LINES:],
            metric_points=report.metric_points,
        )
        await handle.emit(events.job_progress(progress))
    seconds = time.monotonic() - began
    if last is None:
        return JobEnd(job.monitor_job_id, JobState.UNKNOWN, None, None, "the job's end was not reported", seconds)
    value = None
    if last.state is JobState.COMPLETED:
        for metric in last.metrics:
            if metric.name == spec.metric.name and metric.value is not None:
                value = metric.value
    return JobEnd(job.monitor_job_id, last.state, last.exit_code, value, last.detail, seconds)


async def _launch(lab: Lab, handle: DrivenCampaign, cycle: int, experiment: Experiment, wait: GpuWait) -> Launched:
    """The job launched; while the GPUs it asks for are all held by other jobs (another campaign's, say), the
    campaign waits, saying so, and asks the monitor again until one frees. The monitor decides: its reservations
    are durable, so two jobs never share a GPU, across restarts too."""
    request_id = f"{handle.campaign_id}/c{cycle}/job"
    deadline = time.monotonic() + wait.limit_seconds
    said = ""
    while True:
        try:
            return await lab.launch(experiment, request_id=request_id)
        except QuarryError as error:
            if error.reason is not ErrorReason.GPUS_BUSY:
                raise
            if time.monotonic() >= deadline:
                hours = wait.limit_seconds / 3600
                raise FailedPrecondition(
                    f"no GPU freed for the experiment in {hours:g} h: {error.message}", reason=ErrorReason.GPUS_BUSY
                ) from error
            if error.message != said:  # once per reason, not once per poll
                said = error.message
                await handle.set_phase(Phase.WAITING, cycle, f"waiting for a GPU: {error.message}")
        await asyncio.sleep(wait.poll_seconds)
