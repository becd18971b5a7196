"""Local jobs in the bubblewrap sandbox, as real processes: what they can see, write and reach, and that
stopping one stops what it left running; a monitor without a sandbox refuses them unless told otherwise."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from monitor_svc.jobs.sandbox import ALLOWED_VARIABLES
from quarry.clients.channels import insecure_channel
from quarry.v1 import monitor_pb2, monitor_pb2_grpc
from tests.conftest import start_service, stop_service
from tests.monitor_svc.jobs.helpers import Stub, local, log_lines, serving, settings, watch_all
from tests.rpc import error_reason, expect_error

MESH_SECRET = "mesh-" + uuid.uuid4().hex
OTEL_SECRET = "otel-" + uuid.uuid4().hex


def with_marker(marker: str) -> Iterator[int]:
    """The processes whose command line holds `marker`."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    yield int(entry.name)
            except OSError:
                continue


@pytest.mark.slow
async def test_a_job_finds_no_secret_of_the_monitor_nor_its_process(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    environment = {
        "QUARRY_DATA_DIR": str(tmp_path / "data"),
        "QUARRY_MONITOR_ALLOW_JOB_SUBMISSION": "true",
        "QUARRY_MONITOR_JOB_POLL_SECONDS": "0.2",
        "QUARRY_MESH_INSECURE": "true",
        "QUARRY_MESH_TOKEN": MESH_SECRET,
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {OTEL_SECRET}",
    }
    monitor = await asyncio.to_thread(start_service, "monitor", environment, tmp_path)
    body = """\
    import pathlib
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            for part in ("environ", "cmdline"):
                try:
                    print(part, entry.name, (entry / part).read_bytes().replace(b"\\0", b" ").decode(), flush=True)
                except OSError as error:
                    print(part, entry.name, "unreadable", error.strerror, flush=True)
    """
    try:
        async with insecure_channel(monitor.address) as channel:
            stub = monitor_pb2_grpc.MonitorServiceStub(channel)
            request = monitor_pb2.SubmitJobRequest(local=local(work, body), request_id="snoop")
            submitted = await stub.SubmitJob(request)
            responses = await watch_all(stub, submitted.job)
    finally:
        await asyncio.to_thread(stop_service, monitor)
    assert responses[-1].status.state == monitor_pb2.JOB_STATE_COMPLETED
    seen = "\n".join(log_lines(responses))
    assert "job.py" in seen, "the job read its own process: /proc was there to read"
    assert MESH_SECRET not in seen and OTEL_SECRET not in seen
    assert f" {monitor.process.pid} " not in seen and "serve monitor" not in seen, "the monitor is not visible"


async def test_a_daemon_the_job_started_in_a_new_session_ends_with_it_at_its_limit(
    monitor: Stub, tmp_path: Path
) -> None:
    marker = "daemon-" + uuid.uuid4().hex
    daemon = f"setsid {sys.executable} -c 'import time; time.sleep(300)' {marker} & sleep 60"
    command = monitor_pb2.LocalCommand(argv=["sh", "-c", daemon], working_directory=str(tmp_path))
    options = monitor_pb2.JobOptions(wall_clock_limit={"seconds": 1})
    try:
        submitted = await monitor.SubmitJob(
            monitor_pb2.SubmitJobRequest(local=command, request_id="daemon", options=options)
        )
        for _ in range(200):  # it started: its own session, not the job's process group
            started = [pid for pid in with_marker(marker) if os.getsid(pid) != submitted.job.local.pid]
            if started:
                break
            await asyncio.sleep(0.05)
        assert started, "the daemon ran"
        last = (await watch_all(monitor, submitted.job))[-1].status
        assert last.state == monitor_pb2.JOB_STATE_TIMED_OUT
        for _ in range(100):  # the kernel kills the namespace's processes as its init ends
            if not list(with_marker(marker)):
                break
            await asyncio.sleep(0.05)
        assert not list(with_marker(marker)), "nothing of the job is left"
    finally:
        for pid in with_marker(marker):
            os.kill(pid, 9)


async def test_what_a_job_left_running_in_its_sandbox_ends_when_the_job_does(monitor: Stub, tmp_path: Path) -> None:
    marker = "left-" + uuid.uuid4().hex
    daemon = f"setsid {sys.executable} -c 'import time; time.sleep(300)' {marker} & echo started"
    command = monitor_pb2.LocalCommand(argv=["sh", "-c", daemon], working_directory=str(tmp_path))
    try:
        submitted = await monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=command, request_id="left"))
        responses = await watch_all(monitor, submitted.job)
        assert responses[-1].status.state == monitor_pb2.JOB_STATE_COMPLETED and log_lines(responses) == ["started"]
        for _ in range(100):
            if not list(with_marker(marker)):
                break
            await asyncio.sleep(0.05)
        assert not list(with_marker(marker)), "the daemon went with its sandbox"
    finally:
        for pid in with_marker(marker):
            os.kill(pid, 9)


async def test_a_job_writes_its_working_tree_and_tmp_only(monitor: Stub, tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n")
    data = tmp_path / "data"  # the monitor's data directory (helpers.serving), here inside the working tree
    body = f"""\
    def attempt(what, path, mode="a"):
        try:
            with open(path, mode) as file:
                file.write("x\\n")
            print(what, "written", flush=True)
        except OSError as error:
            print(what, "refused", error.strerror, flush=True)
    attempt("tree", "out.txt")
    attempt("tmp", "/tmp/scratch")
    attempt("git", ".git/config")
    attempt("data", {str(data / "planted")!r}, "w")
    attempt("records", {str(data / "monitor" / "jobs" / "planted")!r}, "w")
    print("data holds", sorted(os.listdir({str(data)!r})), os.listdir({str(data / "jobs")!r}), flush=True)
    """
    submitted = await monitor.SubmitJob(monitor_pb2.SubmitJobRequest(local=local(tmp_path, body), request_id="w"))
    lines = log_lines(await watch_all(monitor, submitted.job))
    assert lines[:2] == ["tree written", "tmp written"]
    assert lines[2:4] == ["git refused Read-only file system", "data refused Read-only file system"]
    assert lines[4] == "records refused No such file or directory", "hidden: an empty directory in its place"
    # Hidden: empty, but for the mount point of the job logs (hidden themselves: this job's log among them).
    assert lines[5] == "data holds ['jobs'] []"
    assert (tmp_path / "out.txt").read_text() == "x\n"
    assert (tmp_path / ".git" / "config").read_text() == "[core]\n"
    assert not (data / "planted").exists() and not (data / "monitor" / "jobs" / "planted").exists()
    assert os.listdir(data), "the monitor's own files are there, outside the sandbox"


ENVIRONMENT_BODY = """\
print("names", sorted(os.environ), flush=True)
print("home", os.environ["HOME"], flush=True)
"""


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_the_environment_is_the_allowlist_and_the_jobs_own(sandbox: str, tmp_path: Path) -> None:
    monitor = settings(job_sandbox=sandbox, unsandboxed_jobs=True)
    options = monitor_pb2.JobOptions(environment={"SEED": "7"})
    async with serving(tmp_path, monitor) as stub:
        request = monitor_pb2.SubmitJobRequest(local=local(tmp_path, ENVIRONMENT_BODY), request_id="e", options=options)
        lines = log_lines(await watch_all(stub, (await stub.SubmitJob(request)).job))
    allowed = sorted({"PATH", "HOME", "SEED", *(name for name in ALLOWED_VARIABLES if name in os.environ)})
    if sandbox == "bwrap":
        allowed = sorted([*allowed, "PWD"])  # bwrap sets it as it enters the working directory
    assert lines[0] == f"names {allowed}"
    assert lines[1] == ("home /tmp" if sandbox == "bwrap" else f"home {os.environ['HOME']}")


async def test_without_a_sandbox_and_no_override_a_local_job_is_refused(tmp_path: Path) -> None:
    async with serving(tmp_path, settings(job_sandbox="none")) as stub:
        request = monitor_pb2.SubmitJobRequest(local=local(tmp_path, ENVIRONMENT_BODY), request_id="refused")
        error = await expect_error(stub.SubmitJob(request), grpc.StatusCode.FAILED_PRECONDITION)
    assert error_reason(error) == "SANDBOX_UNAVAILABLE"
    assert "bubblewrap" in (error.details() or "") and "QUARRY_MONITOR_UNSANDBOXED_JOBS" in (error.details() or "")
    assert not list((tmp_path / "data" / "jobs").glob("*")), "nothing was started"


async def test_a_program_that_is_not_there_is_not_started(monitor: Stub, tmp_path: Path) -> None:
    for argv in (["no-such-program-here"], ["./missing.sh"]):
        command = monitor_pb2.LocalCommand(argv=argv, working_directory=str(tmp_path))
        request = monitor_pb2.SubmitJobRequest(local=command, request_id=argv[0])
        error = await expect_error(monitor.SubmitJob(request), grpc.StatusCode.FAILED_PRECONDITION)
        assert error_reason(error) == "JOB_NOT_STARTED" and argv[0] in (error.details() or "")


async def test_a_job_with_its_network_isolated_reaches_no_port_outside(monitor: Stub, tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    body = f"""\
    import socket
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
        print("connected", flush=True)
    except OSError as error:
        print("not connected", flush=True)
    """
    results = []
    with listener:
        for isolate in (False, True):
            options = monitor_pb2.JobOptions(isolate_network=isolate)
            command = local(tmp_path, body)
            request = monitor_pb2.SubmitJobRequest(local=command, request_id=f"n{isolate}", options=options)
            results.append(log_lines(await watch_all(monitor, (await monitor.SubmitJob(request)).job)))
    assert results == [["connected"], ["not connected"]]
