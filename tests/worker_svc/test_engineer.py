"""The engineer role end to end: a scripted model reads, searches, patches, smoke-tests and launches a tiny CPU
"training" script in a temporary git workspace, through the worker's workspace tools and the monitor's RPCs.

Once as real processes (worker, scratchpad and monitor started with `quarry serve`, authenticating each other
with mesh tokens) on this machine, once with the workspace on the loopback SSH host (services in this process).
Refusals the model must see as tool errors: a protected path, `..`, an absolute path, a symbolic link out.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from monitor_svc.service import build_host as build_monitor
from quarry.clients.channels import open_channel
from quarry.clients.monitor import MonitorClient
from quarry.clients.scratchpad import ScratchpadClient
from quarry.config import MonitorSettings, QuarrySettings, ScratchpadSettings, WorkerSettings
from quarry.identity import MeshRole
from quarry.mesh_auth import MeshKeys
from quarry.v1 import common_pb2, monitor_pb2, worker_pb2, worker_pb2_grpc
from scratchpad_svc.service import build_host as build_scratchpad
from tests.conftest import ServiceProcess, start_service, stop_service
from tests.fakes.openai_server import Call, Reply, ScriptedModel, Step
from tests.monitor_svc.fake_ssh import fake_ssh_host
from tests.rpc import error_reason, expect_error, violations
from worker_svc.service import build_host as build_worker

TRAIN = """\
import json, sys

config = json.load(open("config.json"))
lr, steps = config["lr"], int(sys.argv[1]) if len(sys.argv) > 1 else config["steps"]
x = 0.0
for step in range(1, steps + 1):
    x -= lr * 2 * (x - 3.0)  # gradient descent on (x - 3)^2
    print(f"step {step} loss={(x - 3.0) ** 2:.6f}", flush=True)
print(f"val_loss={(x - 3.0) ** 2 + 0.01:.6f}", flush=True)
"""
CONFIG = '{"lr": 0.05, "steps": 40}\n'
PATCH = """\
--- a/config.json
+++ b/config.json
@@ -1 +1 @@
-{"lr": 0.05, "steps": 40}
+{"lr": 0.2, "steps": 40}
"""
VAL_LOSS = {"name": "val_loss", "direction": "minimize", "log_regex": r"val_loss=([0-9.]+)"}
ENGINEER_TOOLS = {
    "list_tree",
    "read_file",
    "search_code",
    "write_file",
    "apply_patch",
    "run_command",
    "launch_experiment",
    "job_status",
    "read_scratchpad",
    "append_scratchpad",
}
COMMAND_SECONDS = 20  # the worker's cap on run_command


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def make_project(roots: Path, outside: Path) -> Path:
    """A git workspace with a training script, its config, a protected evaluation harness, and (untracked) a
    symbolic link leading out of it."""
    project = roots / "project"
    for path, text in {
        "train.py": TRAIN,
        "config.json": CONFIG,
        "eval/harness.py": "THRESHOLD = 0.02\n",
    }.items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(text)
    git(project, "init", "-q", "-b", "main")
    git(project, "-c", "user.name=T", "-c", "user.email=t@example.com", "add", "-A")
    git(project, "-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-q", "-m", "initial")
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (project / "outside").symlink_to(outside)
    return project.resolve()


def python(*args: str) -> str:
    return shlex.join([sys.executable, *args])


def engineer_script(model: ScriptedModel) -> None:
    """The model's turns; the last two are chosen once the launched jobs' ids are known."""
    model.script(
        Reply(
            calls=(
                Call("list_tree", {}, "tree"),
                Call("read_file", {"path": "config.json"}, "read"),
                Call("search_code", {"pattern": r"val_loss=", "glob": "*.py"}, "search"),
            )
        ),
        Reply(
            calls=(
                Call("apply_patch", {"patch": PATCH}, "patch"),
                Call("write_file", {"path": "eval/harness.py", "content": "THRESHOLD = 9\n"}, "protected"),
                Call("write_file", {"path": "../escape.txt", "content": "x"}, "dotdot"),
                Call("write_file", {"path": "/tmp/absolute.txt", "content": "x"}, "absolute"),
                Call("write_file", {"path": "outside/planted.txt", "content": "x"}, "symlink-write"),
                Call("read_file", {"path": "outside/secret.txt"}, "symlink-read"),
            )
        ),
        Reply(
            calls=(
                Call("run_command", {"command": python("train.py", "2"), "timeout_seconds": 15}, "smoke"),
                Call("run_command", {"command": "sleep 30", "timeout_seconds": 1}, "too-long"),
                Call("run_command", {"command": "sleep 1", "timeout_seconds": COMMAND_SECONDS + 1}, "over-cap"),
            )
        ),
        Reply(
            calls=(
                Call(
                    "launch_experiment",
                    {"command": python("train.py"), "wall_clock_limit_seconds": 60, "metrics": [VAL_LOSS]},
                    "launch",
                ),
                Call(
                    "launch_experiment",
                    {
                        "command": python("-c", "print('loading', flush=True); raise SystemExit(3)"),
                        "wall_clock_limit_seconds": 60,
                        "metrics": [VAL_LOSS],
                    },
                    "launch-crash",
                ),
            )
        ),
    )
    later: deque[Callable[[list[str]], Step]] = deque(
        [
            lambda ids: Reply(
                calls=(
                    Call("job_status", {"monitor_job_id": ids[0], "wait_seconds": 60}, "status"),
                    Call("job_status", {"monitor_job_id": ids[1], "wait_seconds": 60}, "status-crash"),
                    Call("append_scratchpad", {"kind": "note", "content": f"launched {ids[0]}"}, "note"),
                    Call("append_scratchpad", {"kind": "verdict", "content": "lr 0.2 is better"}, "verdict"),
                )
            ),
            lambda ids: Reply(content="Raised lr to 0.2; the run reached val_loss 0.01."),
        ]
    )

    def next_step(body: dict[str, Any]) -> Step:
        ids = [
            found.group(1)
            for message in body["messages"]
            if message["role"] == "tool"
            for found in [re.match(r"Launched job (job-[0-9a-f]+)", message["content"])]
            if found
        ]
        return later.popleft()(ids)

    model.default = next_step


def tool_results(model: ScriptedModel) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for r in model.requests for m in r["messages"] if m["role"] == "tool"}


def offered(model: ScriptedModel, request: int) -> set[str]:
    return {tool["function"]["name"] for tool in model.requests[request]["tools"]}


@dataclass
class Engineering:
    """Worker, scratchpad and monitor, and the supervisor's mesh token (empty where the mesh is open)."""

    worker: str
    scratchpad: str
    monitor: str
    token: str = ""


def worker_env(model: ScriptedModel, scratchpad: str, monitor: str) -> dict[str, str]:
    return {
        "QUARRY_WORKER_SCRATCHPAD_ADDRESS": scratchpad,
        "QUARRY_WORKER_MONITOR_ADDRESS": monitor,
        "QUARRY_WORKER_MODEL_BASE_URL": model.base_url,
        "QUARRY_WORKER_MODEL_NAME": "scripted",
        "QUARRY_WORKER_ENGINEER_COMMAND_SECONDS": str(COMMAND_SECONDS),
    }


@asynccontextmanager
async def as_processes(tmp_path: Path, model: ScriptedModel, roots: Path) -> AsyncIterator[Engineering]:
    """The three services as `quarry serve` processes, authenticating each other as a deployment does."""
    keys = MeshKeys.generate()
    common = {"QUARRY_DATA_DIR": str(tmp_path / "data"), "QUARRY_LOG_LEVEL": "WARNING"}
    monitor_env = {
        "QUARRY_MONITOR_ALLOW_JOB_SUBMISSION": "true",
        "QUARRY_MONITOR_WORKSPACE_ROOTS": json.dumps([str(roots)]),
        "QUARRY_MONITOR_JOB_POLL_SECONDS": "0.2",
        "QUARRY_MONITOR_JOB_STOP_GRACE_SECONDS": "1",
    }
    started: list[ServiceProcess] = []

    def start(name: str, env: dict[str, str], role: MeshRole | None) -> ServiceProcess:
        started.append(start_service(name, {**common, **keys.environment(role), **env}, tmp_path))
        return started[-1]

    try:
        scratchpad = await asyncio.to_thread(start, "scratchpad", {}, None)
        monitor = await asyncio.to_thread(start, "monitor", monitor_env, None)
        env = worker_env(model, scratchpad.address, monitor.address)
        worker = await asyncio.to_thread(start, "worker", env, MeshRole.WORKER)
        yield Engineering(worker.address, scratchpad.address, monitor.address, keys.tokens[MeshRole.SUPERVISOR])
        for service in reversed(started):
            assert stop_service(service) == 0, service.log()
    finally:
        for service in started:
            stop_service(service)


@asynccontextmanager
async def over_ssh(tmp_path: Path, model: ScriptedModel, roots: Path) -> AsyncIterator[Engineering]:
    """The services in this process; the workspace on the loopback SSH host."""
    (tmp_path / "logs").mkdir()  # the host's log root
    common = QuarrySettings(data_dir=tmp_path / "data", shutdown_grace_seconds=1)
    async with fake_ssh_host(tmp_path) as fake:
        settings = fake.settings(workspace_roots=[str(roots)], job_poll_seconds=0.2, job_stop_grace_seconds=1.0)
        monitor = await build_monitor(settings, common)
        scratchpad = await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common)
        async with monitor, scratchpad:
            with pytest.MonkeyPatch.context() as patch:
                for name, value in worker_env(model, scratchpad.address, monitor.address).items():
                    patch.setenv(name, value)
                worker_settings = WorkerSettings(address="127.0.0.1:0")
            async with await build_worker(worker_settings, common) as worker:
                yield Engineering(worker.address, scratchpad.address, monitor.address)


async def delegate(
    engineering: Engineering, request: worker_pb2.DelegateRequest
) -> tuple[worker_pb2.DelegationResult, worker_pb2.Delegation]:
    async with open_channel(engineering.worker, token=engineering.token) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        async for response in stub.Delegate(request, timeout=120):
            if response.WhichOneof("event") == "result":
                recorded = await stub.GetDelegation(
                    worker_pb2.GetDelegationRequest(delegation_id=request.delegation_id)
                )
                return response.result, recorded.delegation
    raise AssertionError("no result")


def engineer_request(
    thread_id: str, workspace_id: str, delegation_id: str = "run-e:call-1"
) -> worker_pb2.DelegateRequest:
    return worker_pb2.DelegateRequest(
        delegation_id=delegation_id,
        run_id="run-e",
        tool_call_id=delegation_id.split(":")[-1],
        scratchpad_thread_id=thread_id,
        task=worker_pb2.ResearchTask(objective="Make the training converge faster.", workspace_id=workspace_id),
        role=common_pb2.ROLE_ENGINEER,
        budget=worker_pb2.DelegationBudget(max_turns=10),
    )


@pytest.mark.parametrize(
    ("backend", "host"),
    [pytest.param(as_processes, "", marks=pytest.mark.slow, id="processes"), pytest.param(over_ssh, "gpu1", id="ssh")],
)
async def test_a_scripted_engineer_patches_smoke_tests_and_launches_a_training_run(
    tmp_path: Path, model: ScriptedModel, backend: Any, host: str
) -> None:
    roots = tmp_path / "workspaces"
    project = make_project(roots, tmp_path / "outside")
    engineer_script(model)
    async with (
        backend(tmp_path, model, roots) as engineering,
        open_channel(engineering.monitor, token=engineering.token) as monitor_channel,
        open_channel(engineering.scratchpad, token=engineering.token) as scratchpad_channel,
    ):
        monitor = MonitorClient(monitor_channel)
        workspace = await monitor.open_workspace(str(project), host=host, protected_paths=["eval", "data"])
        thread = await ScratchpadClient(scratchpad_channel).create_thread(title="engineering")
        result, recorded = await delegate(engineering, engineer_request(thread.thread_id, workspace.workspace_id))
        # The training run as the monitor keeps it: its metric read from its log by the monitor.
        [job] = [job for job in result.jobs if job.monitor_job_id in tool_results(model)["launch"]]
        status = await monitor.job_status(monitor_pb2.JobRef(monitor_job_id=job.monitor_job_id))

    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED, result.error
    assert offered(model, 0) == ENGINEER_TOOLS, "an engineer gets its workspace tools, and no web tools"
    results = tool_results(model)
    assert "config.json (" in results["tree"] and "eval/" in results["tree"] and "outside (symlink)" in results["tree"]
    assert '"lr": 0.05' in results["read"]
    assert re.search(r"train\.py:\d+: .*val_loss=", results["search"])

    assert results["patch"] == "Applied; modified: config.json."
    assert (project / "config.json").read_text() == '{"lr": 0.2, "steps": 40}\n'
    assert results["protected"].startswith("error:") and "protected by the rule 'eval'" in results["protected"]
    assert (project / "eval/harness.py").read_text() == "THRESHOLD = 0.02\n"
    assert results["dotdot"].startswith("error:") and "'..'" in results["dotdot"]
    assert results["absolute"].startswith("error:") and "not an absolute one" in results["absolute"]
    for escape in ("symlink-write", "symlink-read"):
        assert results[escape].startswith("error:") and "symbolic link" in results[escape], results[escape]
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "outside" / "planted.txt").exists()

    assert results["smoke"].startswith("completed, exit code 0"), results["smoke"]
    assert "step 2 loss=" in results["smoke"] and "val_loss=" in results["smoke"]
    assert results["too-long"].startswith("timed_out"), results["too-long"]
    assert "wall-clock limit of 1 s" in results["too-long"]
    assert results["over-cap"].startswith("error:") and "launch_experiment" in results["over-cap"]

    assert results["launch"].startswith(f"Launched job {job.monitor_job_id} (log ")
    assert results["status"].startswith("completed, exit code 0"), results["status"]
    assert "metric val_loss: 0.01 (best 0.01 of 1 values)" in results["status"]
    assert results["status-crash"].startswith("failed, exit code 3"), results["status-crash"]
    assert "metric val_loss: not found" in results["status-crash"] and "loading" in results["status-crash"]
    assert status.state == monitor_pb2.JOB_STATE_COMPLETED and status.metrics[0].value == pytest.approx(0.01)

    assert results["note"].startswith("appended as entry"), results["note"]
    assert "ROLE_ENGINEER may not write ENTRY_KIND_VERDICT" in results["verdict"], "the scratchpad's authority"

    # The result hands back what the tools did, as data: the experiments launched and the files changed.
    assert len(result.jobs) == 2 and any(j.monitor_job_id in results["launch-crash"] for j in result.jobs)
    assert job.WhichOneof("target") == ("remote" if host else "local") and job.log_path
    assert (job.remote.host if host else "local") == (host or "local")
    assert list(result.files_changed) == ["config.json"]
    assert recorded.task.workspace_id == workspace.workspace_id and recorded.result == result, "as recorded"


async def test_only_an_engineer_gets_a_workspace_and_only_on_a_worker_with_a_monitor(
    tmp_path: Path, model: ScriptedModel
) -> None:
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1)
    monitor = await build_monitor(MonitorSettings(address="127.0.0.1:0"), common)
    scratchpad = await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common)
    async with monitor, scratchpad:
        settings: dict[str, Any] = {
            "address": "127.0.0.1:0",
            "scratchpad_address": scratchpad.address,
            "model_base_url": model.base_url,
            "model_name": "scripted",
        }
        with_monitor = await build_worker(WorkerSettings(**settings, monitor_address=monitor.address), common)
        without = await build_worker(WorkerSettings(**settings, database_url=f"sqlite:///{tmp_path}/w2.db"), common)
        # The verifier answers in prose twice (its repair turn included): it ends without a verdict, which is
        # not what this test is about; the tools it was offered are.
        model.script(Reply(content="Nothing to build."), Reply(content="Nothing to check."), Reply(content="No."))
        async with with_monitor, without, open_channel(scratchpad.address) as channel:
            thread_id = (await ScratchpadClient(channel).create_thread(title="roles")).thread_id
            engineering = Engineering(with_monitor.address, scratchpad.address, monitor.address)
            for role in (common_pb2.ROLE_RESEARCHER, common_pb2.ROLE_VERIFIER):
                request = engineer_request(thread_id, "", f"run-e:{role}")
                request.role = role
                if role == common_pb2.ROLE_VERIFIER:
                    request.task.input_refs.append("1")  # a blind role names the entries it judges
                result, _ = await delegate(engineering, request)
                if role == common_pb2.ROLE_RESEARCHER:
                    assert result.outcome == common_pb2.DELEGATION_OUTCOME_SUCCEEDED
            async with open_channel(with_monitor.address) as worker_channel:
                stub = worker_pb2_grpc.WorkerServiceStub(worker_channel)
                no_workspace = engineer_request(thread_id, "", "run-e:no-workspace")
                researcher_with_one = engineer_request(thread_id, "ws-0123456789abcdef", "run-e:researcher")
                researcher_with_one.role = common_pb2.ROLE_RESEARCHER
                for request in (no_workspace, researcher_with_one):
                    error = await expect_error(_first(stub, request), grpc.StatusCode.INVALID_ARGUMENT)
                    assert "task.workspace_id" in violations(error)
            async with open_channel(without.address) as worker_channel:
                stub = worker_pb2_grpc.WorkerServiceStub(worker_channel)
                request = engineer_request(thread_id, "ws-0123456789abcdef", "run-e:no-monitor")
                error = await expect_error(_first(stub, request), grpc.StatusCode.FAILED_PRECONDITION)
                assert error_reason(error) == "MONITOR_NOT_CONFIGURED" and "QUARRY_WORKER_MONITOR_ADDRESS" in (
                    error.details() or ""
                )
    for index in (0, 1):
        tools = offered(model, index)
        assert tools.isdisjoint(ENGINEER_TOOLS - {"job_status", "read_scratchpad", "append_scratchpad"}), tools
    assert "perform_web_search" in offered(model, 0)


async def _first(stub: worker_pb2_grpc.WorkerServiceStub, request: worker_pb2.DelegateRequest) -> object:
    stream: Any = stub.Delegate(request, timeout=30)
    async for response in stream:
        return response
    return None
