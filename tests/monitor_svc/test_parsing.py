"""nvidia-smi, sacct, squeue and sbatch output: read strictly, mapped to what a watcher needs."""

from __future__ import annotations

import pytest

from monitor_svc.jobs.slurm import parse_sacct, parse_sbatch, parse_squeue, parse_time_limit
from monitor_svc.smi import MalformedOutput, parse_gpus
from quarry.vocabulary import JobState


@pytest.mark.parametrize(
    ("line", "state", "exit_code"),
    [
        ("42|COMPLETED|0:0|01:00:00", JobState.COMPLETED, 0),
        ("42|COMPLETED|1:0|01:00:00", JobState.FAILED, 1),  # a non-zero exit is never "completed"
        ("42|FAILED|3:0|01:00:00", JobState.FAILED, 3),
        ("42|OUT_OF_MEMORY|0:125|01:00:00", JobState.FAILED, 253),
        ("42|TIMEOUT|0:0|00:10:00", JobState.TIMED_OUT, None),
        ("42|CANCELLED by 1000|0:15|UNLIMITED", JobState.CANCELLED, 143),
        ("42|CANCELLED+|0:0|UNLIMITED", JobState.CANCELLED, None),
        ("42|RUNNING|0:0|1-00:00:00", JobState.RUNNING, None),
        ("42|PENDING|0:0|30", JobState.PENDING, None),
    ],
)
def test_sacct_states_and_exit_codes(line: str, state: JobState, exit_code: int | None) -> None:
    found = parse_sacct(f"{line}\n42.batch|RUNNING|0:0|\n", "42")
    assert found is not None and (found.state, found.exit_code) == (state, exit_code)


def test_sacct_reads_the_job_line_and_its_time_limit() -> None:
    found = parse_sacct("42.batch|FAILED|9:0|\n42|RUNNING|0:0|1-02:03:04\n", "42")
    assert found is not None and found.state is JobState.RUNNING
    assert found.time_limit_seconds == parse_time_limit("1-02:03:04") == 93784.0
    assert parse_sacct("", "42") is None and parse_sacct("43|RUNNING|0:0|\n", "42") is None
    for bad in ("42|RUNNING|0:0", "42|EXPLODED|0:0|", "42|FAILED|x:0|"):
        with pytest.raises(MalformedOutput):
            parse_sacct(bad, "42")


def test_squeue_and_sbatch() -> None:
    assert parse_squeue("") is None
    single = parse_squeue("PENDING\n")
    assert single is not None and single.state is JobState.PENDING
    array = parse_squeue("PENDING\nRUNNING\nPENDING\n")  # an array job: one line per task
    assert array is not None and array.state is JobState.RUNNING
    assert parse_sbatch("4242;cluster\n") == "4242" and parse_sbatch("17\n") == "17"
    with pytest.raises(MalformedOutput):
        parse_sbatch("Submitted batch job 17\n")


def test_nvidia_smi_values_that_are_missing_or_hold_commas() -> None:
    [gpu] = parse_gpus(
        "0, GPU-a, NVIDIA H200, [N/A], 143771, [Not Supported], 40, [N/A]\n",
        "GPU-a, 7, 512, python train.py --lr=1e-4,--bs=8\n",
    )
    assert (gpu.memory_used_bytes, gpu.utilization_percent, gpu.power_watts) == (0, 0, 0.0)
    assert gpu.processes[0].name == "python train.py --lr=1e-4,--bs=8"
    with pytest.raises(MalformedOutput, match="expected 8 comma-separated fields"):
        parse_gpus("0, GPU-a, NVIDIA H200\n")
