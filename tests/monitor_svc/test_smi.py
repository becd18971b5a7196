"""nvidia-smi output on SSH hosts: read strictly (sacct, squeue and sbatch: tests/monitor_svc/jobs/test_slurm.py)."""

from __future__ import annotations

import pytest

from monitor_svc.smi import MalformedOutput, parse_gpus


def test_nvidia_smi_values_that_are_missing_or_hold_commas() -> None:
    [gpu] = parse_gpus(
        "0, GPU-a, NVIDIA H200, [N/A], 143771, [Not Supported], 40, [N/A]\n",
        "GPU-a, 7, 512, python train.py --lr=1e-4,--bs=8\n",
    )
    assert (gpu.memory_used_bytes, gpu.utilization_percent, gpu.power_watts) == (0, 0, 0.0)
    assert gpu.processes[0].name == "python train.py --lr=1e-4,--bs=8"
    with pytest.raises(MalformedOutput, match="expected 8 comma-separated fields"):
        parse_gpus("0, GPU-a, NVIDIA H200\n")
