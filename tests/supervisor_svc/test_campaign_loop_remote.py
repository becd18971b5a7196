"""The campaign loop end to end over processes and remote hosts, on the lab of
tests/supervisor_svc/campaign_lab.py: a supervisor and a monitor SIGKILLed among `quarry serve` processes find
their job again on an SSH host; and through Slurm, its experiments, a job over its time and one
cancelled from outside. The SSH host is a real OpenSSH server and the cluster a real Slurm (tests/hosts), never fakes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from quarry.clients.campaigns import CampaignsClient
from quarry.clients.channels import insecure_channel, open_channel
from quarry.v1 import campaign_pb2, monitor_pb2, monitor_pb2_grpc
from tests.conftest import TEST_API_KEY
from tests.fakes.openai_server import ScriptedModel
from tests.hosts.openssh import openssh_host
from tests.supervisor_svc.campaign_lab import (
    BASELINE,
    DISCARD,
    KEEP,
    WORSE_CONFIG,
    Ran,
    Script,
    assert_each_metric_is_the_monitors_reading_of_the_jobs_log,
    assert_measured_kept_and_discarded,
    git,
    jobs_by_cycle,
    make_project,
    on_the_host,
    process_lab,
    remote_lab,
    run_campaign,
    script_keep_then_discard,
)


@pytest.mark.long_wait
async def test_over_processes_and_ssh_a_sigkilled_supervisor_and_monitor_restart_and_the_campaign_keeps_the_result(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """Scratchpad, monitor, an engineer worker and the supervisor as `quarry serve` processes with mesh tokens;
    the workspace and its jobs on the SSH host gpu1, a real OpenSSH server. The supervisor and the monitor are
    SIGKILLed while cycle 4's experiment runs, which ends while they are down; both started again on their
    databases, the monitor reconnects to the host and the cycle takes the job's real result, with no second
    launch. (A restarted monitor finding its local jobs is tests/monitor_svc/jobs/test_service.py's.)"""
    script = Script()
    model.default = script
    slow = '{"lr": 0.1, "steps": 20, "sleep": 3}\n'
    script.cycle("Set lr to 0.1 in config.json.", slow, "A larger learning rate converges faster.")
    script.cycle("Set lr to 0.001 in config.json.", WORSE_CONFIG, "A smaller learning rate is more stable.")
    roots = (tmp_path / "roots").resolve()
    project = make_project(roots)
    (tmp_path / "logs").mkdir()
    with openssh_host(tmp_path / "ssh") as ssh:
        host = ssh.ssh_host(log_roots=[str(tmp_path / "logs")], workspace_roots=[str(roots)])
        monitor_env = {"QUARRY_MONITOR_HOSTS": json.dumps({"gpu1": host.model_dump()})}
        after, before, job_id = await _sigkilled_mid_experiment(
            tmp_path, model, roots, on_the_host(project), monitor_env
        )

    assert after[-1].ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED, after[-1].ended.reason
    rows = [event.ledger_recorded for event in [*before, *after] if event.HasField("ledger_recorded")]
    assert [row.cycle for row in rows] == [1, 2, 3, 4, 5]
    assert [row.verdict for row in rows] == [BASELINE, BASELINE, BASELINE, KEEP, DISCARD]
    assert rows[3].job_id == job_id
    # Cycle 4 was neither thought out nor launched again: two THINKs of two turns in all, one job for cycle 4.
    assert len(script.leader_requests) == 4
    waits = [e.phase_changed for e in after if e.phase_changed.phase == campaign_pb2.CAMPAIGN_PHASE_WAITING]
    assert (waits[0].cycle, waits[0].message) == (4, f"job {job_id}")
    assert git(project, "rev-parse", "HEAD") == rows[3].commit
    assert (project / "config.json").read_text() == slow
    # Each experiment started over SSH once, its value read from its log on the host.
    ran = Ran(after[-1].campaign_id, [*before, *after], rows)
    jobs = jobs_by_cycle(ran)
    assert all(job.WhichOneof("target") == "remote" and job.remote.host == "gpu1" for job in jobs.values())
    assert len({job.remote.pid for job in jobs.values()}) == 5
    assert_each_metric_is_the_monitors_reading_of_the_jobs_log(ran, tmp_path / "logs")


async def _sigkilled_mid_experiment(
    tmp_path: Path, model: ScriptedModel, roots: Path, message: campaign_pb2.CampaignSpec, monitor_env: dict[str, str]
) -> tuple[list[campaign_pb2.CampaignEvent], list[campaign_pb2.CampaignEvent], str]:
    """Cycle 4's experiment launched, the supervisor and the monitor SIGKILLed, started again: (the events
    after the restart, those before it, cycle 4's job)."""
    async with process_lab(tmp_path, model, roots, monitor_extra=monitor_env) as lab:
        supervisor, monitor = lab.services["supervisor"], lab.services["monitor"]
        async with open_channel(supervisor.address, token=TEST_API_KEY) as channel:
            campaigns = CampaignsClient(channel)
            campaign = await campaigns.start_campaign(message, request_id="lab-processes")
            before: list[campaign_pb2.CampaignEvent] = []
            async for event in campaigns.stream_campaign(campaign.campaign_id):
                before.append(event)
                changed = event.phase_changed
                if changed.cycle == 4 and changed.phase == campaign_pb2.CAMPAIGN_PHASE_WAITING:
                    break
        job_id = before[-1].phase_changed.message.removeprefix("job ")
        for service in (supervisor, monitor):  # SIGKILL: no lease given up, no loop told, no job seen to end
            service.process.kill()
            service.process.wait()
        await asyncio.sleep(4)  # the experiment (3 s) ends while no monitor watches it
        monitor_port = int(monitor.address.rpartition(":")[2])
        await asyncio.to_thread(lab.start, "monitor", port=monitor_port)
        again = await asyncio.to_thread(lab.start, "supervisor")
        async with open_channel(again.address, token=TEST_API_KEY) as channel:
            campaigns = CampaignsClient(channel)
            after = [
                event
                async for event in campaigns.stream_campaign(
                    campaign.campaign_id, after_sequence_no=before[-1].sequence_no
                )
            ]
    return after, before, job_id


@pytest.mark.long_wait
async def test_through_real_slurm_a_campaigns_experiments_a_job_over_its_time_and_one_scancelled_from_outside(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """The workspace's host is the login node of a real single-node Slurm cluster. While the campaign runs its
    five experiments through sbatch (sacct the authority), two jobs are submitted to the same monitor: one over
    its --time, which Slurm itself stops (it counts whole minutes and checks about every 30 s, so within about
    90 s), and one cancelled with scancel by someone else; each is recorded as what Slurm says it was."""
    async with remote_lab(tmp_path, model, slurm=True) as (lab, cluster):
        assert cluster is not None
        script_keep_then_discard(lab.script)
        initial = git(lab.project, "rev-parse", "HEAD")
        endless = tmp_path / "roots" / "endless.sh"
        endless.write_text("#!/bin/sh\necho started\nsleep 600\n")
        async with insecure_channel(lab.monitor_address) as channel:
            monitor = monitor_pb2_grpc.MonitorServiceStub(channel)
            over = await monitor.SubmitJob(batch_job(endless, "over-time", seconds=20))
            cancelled = await monitor.SubmitJob(batch_job(endless, "cancelled", seconds=600))
            message = on_the_host(lab.project)
            message.experiment.ClearField("argv")
            message.experiment.slurm.script_path = "train.sh"
            message.experiment.slurm.sbatch_args.append("--partition=debug")
            ran, timed, stopped = await asyncio.gather(
                run_campaign(lab, message, "lab-slurm"),
                watch_job(monitor, over.job),
                watch_job(
                    monitor, cancelled.job, when_running=lambda: cluster.run("scancel", cancelled.job.slurm.job_id)
                ),
            )
        jobs = jobs_by_cycle(ran)
        assert sorted(jobs) == [1, 2, 3, 4, 5] and all(job.slurm.host == "gpu1" for job in jobs.values())
        ids = ",".join(job.slurm.job_id for _, job in sorted(jobs.items()))
        fields = "--format=JobID,State,Timelimit,Partition,WorkDir"
        accounted = cluster.run("sacct", "-j", ids, "-X", "-n", "--parsable2", fields)
        over_time = cluster.run(
            "sacct", "-j", over.job.slurm.job_id, "-X", "-n", "--parsable2", "--format=State,Timelimit"
        )

    assert_measured_kept_and_discarded(lab.project, ran, initial)
    # Slurm's own accounting: each experiment submitted once, with the campaign's --time, in the workspace.
    assert [line.split("|") for line in accounted.split()] == [
        [job.slurm.job_id, "COMPLETED", "00:01:00", "debug", str(lab.project)] for _, job in sorted(jobs.items())
    ]
    assert_each_metric_is_the_monitors_reading_of_the_jobs_log(ran, tmp_path / "logs")
    assert timed[-1].status.state == monitor_pb2.JOB_STATE_TIMED_OUT, timed[-1]
    assert over_time.strip() == "TIMEOUT|00:01:00"  # Slurm itself stopped it at its --time
    assert "started" in (tmp_path / "logs" / f"{over.job.monitor_job_id}.log").read_text()
    assert stopped[-1].status.state == monitor_pb2.JOB_STATE_CANCELLED, stopped[-1]


def batch_job(script: Path, request_id: str, *, seconds: int) -> monitor_pb2.SubmitJobRequest:
    return monitor_pb2.SubmitJobRequest(
        slurm=monitor_pb2.SlurmSubmission(host="gpu1", script_path=str(script)),
        request_id=request_id,
        options=monitor_pb2.JobOptions(wall_clock_limit={"seconds": seconds}),
    )


async def watch_job(
    monitor: monitor_pb2_grpc.MonitorServiceStub,
    job: monitor_pb2.JobRef,
    when_running: Callable[[], object] | None = None,
) -> list[monitor_pb2.WatchJobResponse]:
    """The job's reports until it ends; `when_running` is called (in a thread) once it is seen running."""
    seen: list[monitor_pb2.WatchJobResponse] = []
    request = monitor_pb2.WatchJobRequest(job=job, poll_interval={"seconds": 1})
    async for response in monitor.WatchJob(request, timeout=240):
        seen.append(response)
        if when_running is not None and response.status.state == monitor_pb2.JOB_STATE_RUNNING:
            await asyncio.to_thread(when_running)
            when_running = None
    return seen
