"""The campaign loop end to end over processes and remote hosts, on the lab of
tests/supervisor_svc/campaign_lab.py: a supervisor SIGKILLed among `quarry serve` processes finds its job again;
the happy path with the workspace on an SSH host, and through Slurm.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from quarry.clients.campaigns import CampaignsClient
from quarry.clients.channels import open_channel
from quarry.v1 import campaign_pb2
from tests.conftest import TEST_API_KEY
from tests.fakes.openai_server import ScriptedModel
from tests.supervisor_svc.campaign_lab import (
    BASELINE,
    DISCARD,
    KEEP,
    WORSE_CONFIG,
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
    spec,
)


async def test_over_processes_a_sigkilled_supervisor_and_monitor_restart_and_the_campaign_keeps_the_jobs_result(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """Scratchpad, monitor, an engineer worker and the supervisor as `quarry serve` processes with mesh tokens;
    the supervisor and the monitor SIGKILLed while cycle 4's experiment runs, which ends while they are down;
    both started again on their databases. The cycle takes the job's real result, with no second launch."""
    script = Script()
    model.default = script
    slow = '{"lr": 0.1, "steps": 20, "sleep": 3}\n'
    script.cycle("Set lr to 0.1 in config.json.", slow, "A larger learning rate converges faster.")
    script.cycle("Set lr to 0.001 in config.json.", WORSE_CONFIG, "A smaller learning rate is more stable.")
    roots = (tmp_path / "roots").resolve()
    project = make_project(roots)
    async with process_lab(tmp_path, model, roots) as lab:
        supervisor, monitor = lab.services["supervisor"], lab.services["monitor"]
        async with open_channel(supervisor.address, token=TEST_API_KEY) as channel:
            campaigns = CampaignsClient(channel)
            campaign = await campaigns.start_campaign(spec(project, cycles=5), request_id="lab-processes")
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


async def test_the_happy_path_with_the_workspace_on_an_ssh_host(tmp_path: Path, model: ScriptedModel) -> None:
    async with remote_lab(tmp_path, model) as (lab, host):
        script_keep_then_discard(lab.script)
        initial = git(lab.project, "rev-parse", "HEAD")
        ran = await run_campaign(lab, on_the_host(lab.project), "lab-ssh")

    assert_measured_kept_and_discarded(lab.project, ran, initial)
    jobs = jobs_by_cycle(ran)
    assert sorted(jobs) == [1, 2, 3, 4, 5]
    assert all(job.WhichOneof("target") == "remote" and job.remote.host == "gpu1" for job in jobs.values()), jobs
    launches = [command for command in host.commands if sys.executable in command and "train.py" in command]
    assert len(launches) == 5, "each experiment started over SSH, once"
    assert_each_metric_is_the_monitors_reading_of_the_jobs_log(ran, tmp_path / "logs")


async def test_the_happy_path_through_slurm(tmp_path: Path, model: ScriptedModel) -> None:
    async with remote_lab(tmp_path, model) as (lab, host):
        host.run_batch_jobs()
        script_keep_then_discard(lab.script)
        initial = git(lab.project, "rev-parse", "HEAD")
        message = on_the_host(lab.project)
        message.experiment.ClearField("argv")
        message.experiment.slurm.script_path = "train.sh"
        message.experiment.slurm.sbatch_args.append("--partition=cpu")
        ran = await run_campaign(lab, message, "lab-slurm")

    assert_measured_kept_and_discarded(lab.project, ran, initial)
    jobs = jobs_by_cycle(ran)
    assert [(job.slurm.host, job.slurm.job_id) for _, job in sorted(jobs.items())] == [
        ("gpu1", str(job_id)) for job_id in range(101, 106)
    ]
    submissions = host.batch_submissions()
    assert len(submissions) == 5, "each experiment submitted once"
    for arguments in submissions:
        assert arguments[:2] == ["--parsable", "--partition=cpu"] and arguments[-1] == f"{lab.project}/train.sh"
        assert f"--chdir={lab.project}" in arguments and "--time=0-00:01:00" in arguments
    assert_each_metric_is_the_monitors_reading_of_the_jobs_log(ran, tmp_path / "logs")
