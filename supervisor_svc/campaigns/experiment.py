"""EXECUTE and WAIT: launch the cycle's experiment through the monitor, and wait for its end with no model call.

A job is submitted with a request_id per cycle and run, so a loop that restarts mid-cycle gets the
job it launched back from the monitor instead of launching a second one. While it runs, each report
of the monitor becomes a job-progress event; its end gives the metric the monitor parsed.
"""

from __future__ import annotations

import time

from quarry.client import MonitorClient
from quarry.convert import JOB_STATES, job_ref_from_proto
from quarry.v1 import monitor_pb2
from quarry.vocabulary import JobState
from supervisor_svc.campaigns import events
from supervisor_svc.campaigns.model import CampaignSpec, JobProgress, MetricPoint, Phase
from supervisor_svc.campaigns.reflect import JobEnd
from supervisor_svc.campaigns.service import CampaignHandle
from supervisor_svc.campaigns.signals import Direction

# However long an experiment may run, the wait for it gives up an hour past its limit (30 days without one).
_UNBOUNDED_SECONDS = 30 * 24 * 3600.0
_WAIT_SLACK_SECONDS = 3600.0


def _submit_request(
    spec: CampaignSpec, campaign_id: str, cycle: int, workspace_id: str
) -> monitor_pb2.SubmitJobRequest:
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
    options = monitor_pb2.JobOptions(workspace_id=workspace_id, metrics=[metric_spec])
    if experiment.wall_clock_seconds:
        options.wall_clock_limit.FromSeconds(max(int(experiment.wall_clock_seconds), 1))
    if experiment.gpu_count or experiment.gpu_indices:
        options.gpus.count = experiment.gpu_count
        options.gpus.indices.extend(experiment.gpu_indices)
    request = monitor_pb2.SubmitJobRequest(request_id=f"{campaign_id}/c{cycle}/job", options=options)
    # In the workspace's root, on its host: the monitor places each kind of job there.
    if experiment.slurm is not None:
        request.slurm.script_path = experiment.slurm.script_path
        request.slurm.sbatch_args.extend(experiment.slurm.sbatch_args)
    elif spec.workspace.host:
        request.remote.argv.extend(experiment.argv)
    else:
        request.local.argv.extend(experiment.argv)
    return request


async def run_experiment(
    monitor: MonitorClient, handle: CampaignHandle, workspace_id: str, cycle: int, poll_seconds: int
) -> JobEnd:
    """Launch the cycle's experiment (or find it again after a restart) and wait for its end: no model call."""
    spec = handle.record.spec
    began = time.monotonic()
    submitted = await monitor.submit_job(_submit_request(spec, handle.campaign_id, cycle, workspace_id))
    job = submitted.job
    await handle.set_phase(Phase.WAITING, cycle, f"job {job.monitor_job_id}")
    status: monitor_pb2.JobStatus | None = None
    deadline = (spec.experiment.wall_clock_seconds or _UNBOUNDED_SECONDS) + _WAIT_SLACK_SECONDS
    async for response in monitor.watch_job(job, deadline_seconds=deadline, poll_seconds=poll_seconds):
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
        await handle.emit(events.job_progress(progress))
    ended = JOB_STATES.from_proto(status.state) if status is not None else None
    state = ended or JobState.UNKNOWN
    exit_code = status.exit_code if status is not None and status.HasField("exit_code") else None
    value = None
    if status is not None and state is JobState.COMPLETED:
        for result in status.metrics:
            if result.name == spec.metric.name and result.state == monitor_pb2.METRIC_STATE_FOUND:
                value = result.value
    detail = status.detail if status is not None else "the job's end was not reported"
    return JobEnd(job.monitor_job_id, state, exit_code, value, detail, time.monotonic() - began)
