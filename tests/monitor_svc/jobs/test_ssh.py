"""Jobs on an SSH host (monitor_svc/jobs/ssh.py) over a real SSH connection (tests/monitor_svc/fake_ssh.py):
their GPUs, exit status and metrics, their wall-clock limit, and processes the monitor did not start.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.monitor_svc.fake_ssh import FakeHost
from tests.monitor_svc.jobs.helpers import LOSS, Stub, live_members, log_lines, script, serving, watch_all


async def test_a_job_on_an_ssh_host_gets_a_free_gpu_its_exit_status_and_its_metrics(
    remote_monitor: Stub, tmp_path: Path
) -> None:
    body = """\
    print("devices", os.environ["CUDA_VISIBLE_DEVICES"], "seed", os.environ["SEED"], flush=True)
    print("loss=0.5", flush=True)
    with open("metrics.jsonl", "w") as out:
        out.write('{"acc": 0.9}\\n')
    raise SystemExit(3)
    """
    # The SSH server runs on this machine, so the "remote" job is a process here too.
    command = monitor_pb2.RemoteCommand(
        host="gpu1", argv=[sys.executable, script(tmp_path, body)], working_directory=str(tmp_path)
    )
    accuracy = monitor_pb2.MetricSpec(
        name="acc",
        direction=monitor_pb2.METRIC_DIRECTION_MAXIMIZE,
        jsonl_file=monitor_pb2.JsonlMetric(path="metrics.jsonl", key="acc"),
    )
    options = monitor_pb2.JobOptions(
        environment={"SEED": "11"}, gpus=monitor_pb2.GpuRequest(count=1), metrics=[LOSS, accuracy]
    )
    submitted = await remote_monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(remote=command, request_id="remote-1", options=options)
    )
    assert list(submitted.gpu_indices) == [1], "nvidia-smi shows GPU 0 in use"
    assert submitted.job.remote.host == "gpu1" and submitted.job.log_path.startswith(str(tmp_path / "logs"))
    responses = await watch_all(remote_monitor, submitted.job)
    last = responses[-1].status
    assert last.state == monitor_pb2.JOB_STATE_FAILED and last.exit_code == 3
    assert [(m.name, m.state, m.value) for m in last.metrics] == [
        ("loss", monitor_pb2.METRIC_STATE_FOUND, 0.5),
        ("acc", monitor_pb2.METRIC_STATE_FOUND, 0.9),
    ]
    assert "devices 1 seed 11" in log_lines(responses)


async def test_a_job_on_an_ssh_host_past_its_limit_is_stopped(remote_monitor: Stub, tmp_path: Path) -> None:
    command = monitor_pb2.RemoteCommand(host="gpu1", command_line="sleep 60")
    options = monitor_pb2.JobOptions(wall_clock_limit={"seconds": 1})
    submitted = await remote_monitor.SubmitJob(
        monitor_pb2.SubmitJobRequest(remote=command, request_id="remote-sleep", options=options)
    )
    last = (await watch_all(remote_monitor, submitted.job))[-1].status
    assert last.state == monitor_pb2.JOB_STATE_TIMED_OUT, last.detail
    assert live_members(submitted.job.remote.pid) == []


async def test_a_process_on_a_remote_host_and_its_log(
    ssh_host: FakeHost, ssh_monitor: monitor_pb2_grpc.MonitorServiceStub, tmp_path: Path
) -> None:
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "remote.log"
    log.write_text("epoch 1\n")
    # The SSH server runs on this machine, so a local process is "remote" to the monitor.
    sleeper = await asyncio.create_subprocess_exec("sleep", "60")
    job = monitor_pb2.JobRef(remote=monitor_pb2.RemoteProcess(host="gpu1", pid=sleeper.pid), log_path=str(log))

    async def progress() -> None:
        await asyncio.sleep(1.5)
        with log.open("a") as handle:  # a progress bar's carriage returns, and a line not finished yet
            handle.write("epoch 2\rstill epoch 2\nepoch 3 (unfin")
        await asyncio.sleep(1.5)
        with log.open("a") as handle:
            handle.write("ished)\n")
        await asyncio.sleep(1.5)
        sleeper.send_signal(signal.SIGTERM)
        await sleeper.wait()

    changer = asyncio.create_task(progress())
    responses = await watch_all(ssh_monitor, job)
    await changer
    assert responses[0].status.state == monitor_pb2.JOB_STATE_RUNNING
    assert list(responses[0].status.log_tail) == ["epoch 1"]
    new_lines = [line for r in responses[1:] for line in r.new_log_lines]
    assert new_lines == ["epoch 2\rstill epoch 2", "epoch 3 (unfinished)"], "each line once, whole"
    assert responses[-1].status.state == monitor_pb2.JOB_STATE_EXITED
    assert not responses[-1].status.HasField("exit_code"), "another host's process: its status cannot be known"


async def test_a_job_on_an_ssh_host_that_ends_while_no_monitor_runs_keeps_its_exit_status(
    ssh_host: FakeHost, tmp_path: Path
) -> None:
    (tmp_path / "logs").mkdir()
    body = """\
    print("loss=0.4", flush=True)
    wait_for("go")
    raise SystemExit(3)
    """
    command = monitor_pb2.RemoteCommand(
        host="gpu1", argv=[sys.executable, script(tmp_path, body)], working_directory=str(tmp_path)
    )
    request = monitor_pb2.SubmitJobRequest(
        remote=command, request_id="remote-restart", options=monitor_pb2.JobOptions(metrics=[LOSS])
    )
    settings = ssh_host.settings(job_poll_seconds=0.2)
    async with serving(tmp_path, settings) as before:
        submitted = await before.SubmitJob(request)
    # No monitor runs: the job ends, and its wrapper leaves the status beside its log.
    (tmp_path / "go").touch()
    status_file = Path(submitted.job.log_path + ".exit")
    for _ in range(400):
        if await asyncio.to_thread(status_file.exists):
            break
        await asyncio.sleep(0.05)
    async with serving(tmp_path, settings) as after:
        last = (await watch_all(after, submitted.job))[-1].status
    assert (last.state, last.exit_code) == (monitor_pb2.JOB_STATE_FAILED, 3), last
    assert [(m.name, m.value) for m in last.metrics] == [("loss", 0.4)]
