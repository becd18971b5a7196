"""SSH hosts over a real SSH connection (tests/monitor_svc/fake_ssh.py): their GPUs through nvidia-smi on one
reused connection, and host keys checked.
"""

from __future__ import annotations

from pathlib import Path

import asyncssh
import grpc

from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.monitor_svc.fake_ssh import FakeHost, monitor_for
from tests.rpc import error_reason, expect_error


async def test_gpus_of_a_remote_host_over_ssh_reusing_one_connection(ssh_host: FakeHost, tmp_path: Path) -> None:
    host, channel, stub = await monitor_for(ssh_host.settings(), tmp_path)
    try:
        first = await stub.ListGpus(monitor_pb2.ListGpusRequest(host="gpu1"))
        again = await stub.ListGpus(monitor_pb2.ListGpusRequest(host="gpu1"))
    finally:
        await channel.close(None)
        await host.shutdown()
    assert first.unavailable_reason == "" and len(again.gpus) == 2
    busy, idle = first.gpus
    assert (busy.host, busy.index, busy.uuid, busy.name) == ("gpu1", 0, "GPU-aaaa", "NVIDIA H200")
    assert (busy.memory_used_bytes, busy.memory_total_bytes) == (1024 * 2**20, 143771 * 2**20)
    assert (busy.utilization_percent, busy.temperature_celsius, busy.power_watts) == (87, 61, 312.5)
    assert [(p.pid, p.used_memory_bytes, p.name) for p in busy.processes] == [(4242, 2**30, "python")]
    assert idle.power_watts == 0 and list(idle.processes) == []  # [N/A]: not reported, not an error
    assert len(ssh_host.connections) == 1, "one connection serves every command"
    assert ssh_host.closed, "the connection is closed when the monitor stops"


async def test_malformed_nvidia_smi_output_is_a_clear_error(
    ssh_host: FakeHost, ssh_monitor: monitor_pb2_grpc.MonitorServiceStub
) -> None:
    ssh_host.write("gpus.csv", "0, GPU-aaaa, NVIDIA H200, lots, 143771, 87, 61, 312.50\n")
    error = await expect_error(
        ssh_monitor.ListGpus(monitor_pb2.ListGpusRequest(host="gpu1")), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert error_reason(error) == "MALFORMED_OUTPUT"
    assert "memory.used is 'lots'" in (error.details() or "") and "GPU-aaaa" in (error.details() or "")


async def test_an_unknown_host_key_is_refused(ssh_host: FakeHost, tmp_path: Path) -> None:
    stranger = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    ssh_host.known_hosts.write_text(f"[127.0.0.1]:{ssh_host.port} {stranger}\n")
    host, channel, stub = await monitor_for(ssh_host.settings(), tmp_path)
    try:
        error = await expect_error(
            stub.ListGpus(monitor_pb2.ListGpusRequest(host="gpu1")), grpc.StatusCode.FAILED_PRECONDITION
        )
    finally:
        await channel.close(None)
        await host.shutdown()
    assert error_reason(error) == "HOST_KEY_UNKNOWN"
    assert "ssh-keyscan" in (error.details() or "")
