"""`quarry up` starts each service as its own process, reports them, restarts one that dies, and stops them
all in dependency order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from stat import S_IMODE

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quarry.cli.up_state import UpState
from quarry.clients.runs import RunsClient
from quarry.v1 import common_pb2, monitor_pb2, scratchpad_pb2, supervisor_pb2, worker_pb2
from tests.conftest import reusable_port
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography
from tests.fakes.openai_server import Await, Call, Reply, ScriptedModel, Stall

pytestmark = pytest.mark.slow

# The processes of a default `quarry up`, by the names it shows.
NAMES = {"scratchpad", "monitor", "worker-1", "supervisor"}


class QuarryUp:
    """A `quarry up` process whose output is read on a thread, so waiting on it has a deadline."""

    def __init__(self, tmp_path: Path, *args: str, **env: str) -> None:
        self.data_dir = tmp_path / "data"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "quarry", "up", "--ephemeral-ports", "--data-dir", str(self.data_dir), *args],
            # TMPDIR: its run directory lands in tmp_path even when it is killed before cleaning up.
            # COLUMNS: its messages are not wrapped.
            env={
                **os.environ,
                "QUARRY_LOG_LEVEL": "WARNING",
                "QUARRY_SHUTDOWN_GRACE_SECONDS": "2",
                "TMPDIR": str(tmp_path),
                "COLUMNS": "250",
                **env,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self, deadline: float) -> str | None:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError("quarry up said nothing in time:\n" + "".join(self.output)) from None
        if line is not None:
            self.output.append(line)
        return line

    def addresses(self, services: set[str], timeout: float = 60) -> dict[str, str]:
        found: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while set(found) != services:
            line = self.next_line(deadline)
            assert line is not None, "quarry up ended early:\n" + "".join(self.output)
            if line.startswith("serving "):
                _, name, address = line.split()
                found[name] = address
        return found

    def wait_for(self, prefix: str, timeout: float = 60) -> str:
        """The next line that starts with `prefix`."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(deadline)
            assert line is not None, f"quarry up ended before saying {prefix!r}:\n" + "".join(self.output)
            if line.startswith(prefix):
                return line

    def state(self) -> UpState:
        state = UpState.read(self.data_dir)
        assert state is not None and state.pid == self.process.pid
        return state

    def rest_of_output(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while self.next_line(deadline) is not None:
            pass
        return "".join(self.output)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Callable[..., QuarryUp]]:
    started: list[QuarryUp] = []

    def start(*args: str, **env: str) -> QuarryUp:
        instance = QuarryUp(tmp_path, *args, **env)
        started.append(instance)
        return instance

    yield start
    for instance in started:
        if instance.process.poll() is None:
            instance.process.kill()
            instance.process.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def child_pids(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the field after the state is the parent pid
            children.append(int(stat.parent.name))
    return children


def wait_gone(pids: list[int], timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def modes(root: Path) -> dict[str, int]:
    """The permission bits of `root` and of everything in it, by path relative to it."""
    found = {".": S_IMODE(root.stat().st_mode)}
    for directory, names, files in os.walk(root):
        for name in names + files:
            path = Path(directory, name)
            with contextlib.suppress(FileNotFoundError):  # a SQLite journal may come and go
                found[str(path.relative_to(root))] = S_IMODE(path.lstat().st_mode)
    return found


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_up_serves_every_service_and_stops_them_all(
    up: Callable[..., QuarryUp], tmp_path: Path, stop_signal: signal.Signals
) -> None:
    (tmp_path / "data").mkdir(mode=0o755)  # as an older release left it: open to other users
    (tmp_path / "data").chmod(0o755)
    mesh = up()
    addresses = mesh.addresses(NAMES)
    assert f"the data directory {mesh.data_dir} was open to other users (mode 0755); it is 0700 now" in " ".join(
        "".join(mesh.output).split()
    )
    # Everything Quarry wrote there (databases, journals, the lock, the state file, logs) is its user's alone.
    written = modes(mesh.data_dir)
    assert {"scratchpad.db", "worker.db", "supervisor.db", "up.lock", "mesh.json"} <= set(written)
    wrong = {
        path: oct(mode)
        for path, mode in written.items()
        if mode != (0o700 if (mesh.data_dir / path).is_dir() else 0o600)
    }
    assert wrong == {}
    children = child_pids(mesh.process.pid)
    assert len(children) == len(addresses)
    for address in addresses.values():
        with grpc.insecure_channel(address) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
    assert (tmp_path / "data" / "scratchpad.db").exists()
    mesh.process.send_signal(stop_signal)
    assert mesh.process.wait(30) == 0
    assert wait_gone(children) == [], "a service process outlived quarry up"
    assert not (tmp_path / "data" / "mesh.json").exists(), "a clean stop removes the state file"


def test_up_fails_clearly_when_a_service_cannot_start(up: Callable[..., QuarryUp]) -> None:
    mesh = up(QUARRY_SCRATCHPAD_DATABASE_URL="mysql://nowhere/db")
    output = mesh.rest_of_output()
    assert mesh.process.wait(30) == 1
    assert "scratchpad exited with status" in output
    assert "unsupported database" in output


def test_services_stop_when_quarry_up_is_killed(up: Callable[..., QuarryUp]) -> None:
    mesh = up()
    mesh.addresses(NAMES)
    children = child_pids(mesh.process.pid)
    assert children
    mesh.process.kill()  # no chance to clean up: the kernel's parent-death signal must do it
    mesh.process.wait(10)
    assert wait_gone(children) == [], "a service process outlived a killed quarry up"


def test_up_gives_its_services_mesh_credentials_and_refuses_callers_without_one(
    up: Callable[..., QuarryUp], tmp_path: Path
) -> None:
    token_file = tmp_path / "api-token"
    token_file.write_text("api-token-secret\n")
    token_file.chmod(0o600)
    secrets = {
        "QUARRY_MODEL_API_KEY": "model-key-secret",
        "QUARRY_SUPERVISOR_MODEL_API_KEY": "supervisor-tier-secret",
        "QUARRY_WORKER_SEARCH_API_KEY": "search-key-secret",
        "QUARRY_SUPERVISOR_AUTH_TOKEN_FILE": str(token_file),
        "UNRELATED_SECRET": "the shell's own secret",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-collector-key=telemetry-secret",
    }
    mesh = up(QUARRY_MESH_INSECURE="false", **secrets)
    addresses = mesh.addresses(NAMES)
    calls = {
        "scratchpad": ("/quarry.v1.ScratchpadService/CreateThread", scratchpad_pb2.CreateThreadRequest(title="x")),
        "worker": ("/quarry.v1.WorkerService/GetDelegation", worker_pb2.GetDelegationRequest(delegation_id="d")),
        "monitor": ("/quarry.v1.MonitorService/ListGpus", monitor_pb2.ListGpusRequest()),
    }
    for name, (method, request) in calls.items():
        with grpc.insecure_channel(addresses["worker-1" if name == "worker" else name]) as channel:
            call = channel.unary_unary(method, request_serializer=type(request).SerializeToString)
            with pytest.raises(grpc.RpcError) as raised:
                call(request, timeout=10)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED, name  # type: ignore[attr-defined]
    # The services themselves got their credentials: each child holds its own token, or none.
    environments = {}
    for pid in child_pids(mesh.process.pid):
        variables = dict(
            entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry
        )
        service = Path(f"/proc/{pid}/cmdline").read_text().split("\0")[4]
        environments[service] = variables
    tokens = {name: variables.get("QUARRY_MESH_TOKEN") for name, variables in environments.items()}
    assert tokens["scratchpad"] is None and tokens["monitor"] is None
    assert tokens["supervisor"] and tokens["worker"] and tokens["supervisor"] != tokens["worker"]
    peers = {variables["QUARRY_MESH_PEERS"] for variables in environments.values()}
    assert len(peers) == 1 and tokens["supervisor"] not in peers.pop()
    # Each holds only the secrets it uses: the model keys where a model is called (the worker runs the
    # supervisor tier's auditor too), the search key in the worker, the API token in the supervisor.
    held = {name: {v for v in secrets if v in variables} for name, variables in environments.items()}
    telemetry = "OTEL_EXPORTER_OTLP_HEADERS"
    assert held == {
        "scratchpad": {telemetry},
        "monitor": {telemetry},
        "worker": {
            "QUARRY_MODEL_API_KEY",
            "QUARRY_SUPERVISOR_MODEL_API_KEY",
            "QUARRY_WORKER_SEARCH_API_KEY",
            telemetry,
        },
        "supervisor": {"QUARRY_MODEL_API_KEY", "QUARRY_SUPERVISOR_MODEL_API_KEY", "QUARRY_SUPERVISOR_AUTH_TOKEN_FILE"}
        | {telemetry},
    }
    # Nor another service's settings, but for the worker the supervisor tier's model, which it runs too.
    prefixes = {name: f"QUARRY_{name.upper()}_" for name in environments}
    for name, variables in environments.items():
        foreign = {v for v in variables if v.startswith(tuple(p for n, p in prefixes.items() if n != name))}
        assert all(v.startswith("QUARRY_SUPERVISOR_MODEL_") for v in foreign) and (name == "worker" or not foreign)
        assert variables["QUARRY_DATA_DIR"] == str(mesh.data_dir)


def model_env(model: ScriptedModel) -> dict[str, str]:
    return {"QUARRY_MODEL_BASE_URL": model.base_url, "QUARRY_MODEL_NAME": "scripted"}


def worker_ends(events: list[supervisor_pb2.RunEvent]) -> list[supervisor_pb2.ResearchStatusEvent]:
    ended = (supervisor_pb2.RESEARCH_PHASE_WORKER_COMPLETED, supervisor_pb2.RESEARCH_PHASE_WORKER_FAILED)
    return [event.status for event in events if event.status.phase in ended]


async def test_a_worker_killed_under_up_is_restarted_on_its_address_and_the_run_completes_on_it(
    up: Callable[..., QuarryUp], model: ScriptedModel
) -> None:
    script = Choreography()
    model.default = script
    restarted = asyncio.Event()
    script.add("Research slowly", Stall(60))
    script.add("Research again", Reply(content="Found it."))
    script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Research slowly"}, "s-slow"),)),
        # The supervisor's next turn waits for the restart, so its delegation finds the worker back.
        Await(restarted, Reply(calls=(Call("delegate_research", {"objective": "Research again"}, "s-again"),))),
        Reply(content="The second try worked."),
    )
    script.add(REPORT, Reply(content="Found on the restarted worker."))
    # Authenticated, as by default: the restarted worker must accept the supervisor's credentials it had.
    mesh = up(QUARRY_MESH_INSECURE="false", **model_env(model))
    addresses = await asyncio.to_thread(mesh.addresses, NAMES)
    before = mesh.state()
    async with RunsClient.connect(addresses["supervisor"]) as client:
        run = await client.start_run("Does the run survive a worker's death?")
        events = []
        async for event in client.stream_run(run.run_id):
            events.append(event)
            if event.status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING and not restarted.is_set():
                os.kill(before.processes["worker-1"], signal.SIGKILL)
                await asyncio.to_thread(mesh.wait_for, "restarted worker-1")
                restarted.set()
        stored = await client.get_run(run.run_id)
    ends = worker_ends(events)
    assert [end.phase for end in ends] == [
        supervisor_pb2.RESEARCH_PHASE_WORKER_FAILED,
        supervisor_pb2.RESEARCH_PHASE_WORKER_COMPLETED,
    ]
    assert ends[0].delegation_error.code == common_pb2.DELEGATION_ERROR_CODE_WORKER_UNAVAILABLE
    assert [end.worker_id for end in ends] == ["worker-1", "worker-1"]
    lost, served = script.tool_results(SUPERVISOR)
    assert lost.startswith(f"error: delegation {ends[0].delegation_id} failed (WORKER_UNAVAILABLE)")
    assert served.startswith(f"delegation {ends[1].delegation_id} succeeded")
    assert events[-1].WhichOneof("payload") == "completed" and stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED
    # Back on the address its peers hold; nothing else was restarted.
    after = mesh.state()
    assert after.services == before.services
    assert after.processes["worker-1"] != before.processes["worker-1"]
    assert {n: p for n, p in after.processes.items() if n != "worker-1"} == {
        n: p for n, p in before.processes.items() if n != "worker-1"
    }
    output = "".join(mesh.output)
    assert "worker-1 was killed by SIGKILL; restarting it in 0.5 s (restart 1 of at most 5 in 600 s)" in output
    # The table printed after the restart: service, address, pid, restarts.
    row = next(line for line in reversed(mesh.output) if "│ worker-1 " in line)
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    assert cells == ["worker-1", addresses["worker-1"], str(after.processes["worker-1"]), "1"]


def test_a_service_dying_past_the_restart_bound_stops_the_mesh(up: Callable[..., QuarryUp]) -> None:
    mesh = up("--max-restarts", "1")
    mesh.addresses(NAMES)
    children = child_pids(mesh.process.pid)
    os.kill(mesh.state().processes["worker-1"], signal.SIGKILL)
    mesh.wait_for("restarted worker-1")
    restarted = mesh.state().processes["worker-1"]
    os.kill(restarted, signal.SIGKILL)
    output = mesh.rest_of_output()
    assert mesh.process.wait(30) == 1
    assert (
        "quarry up failed: worker-1 was killed by SIGKILL: 2 exits within 600 s, more than the 1 restarts allowed"
        in output
    )
    assert wait_gone([*children, restarted]) == [], "a service process outlived quarry up"
    assert not (mesh.data_dir / "mesh.json").exists()


API_KEY_HINT = "(quarry commands here send it; others: QUARRY_API_KEY)"


def test_a_second_up_on_the_same_data_dir_is_refused_and_clients_find_the_first(up: Callable[..., QuarryUp]) -> None:
    # The mesh's model endpoint, where nothing listens; the terminal that runs doctor is set to another.
    mesh_model = f"http://127.0.0.1:{reusable_port()}/v1"
    first = up(QUARRY_MODEL_BASE_URL=mesh_model)
    addresses = first.addresses(NAMES)
    second = up()
    assert second.process.wait(30) == 1
    refusal = second.rest_of_output()
    assert f"another quarry up (pid {first.process.pid}) is running on {first.data_dir}" in refusal
    assert first.process.poll() is None and first.state().services["supervisor"] == [addresses["supervisor"]]
    terminal_model = f"http://127.0.0.1:{reusable_port()}/elsewhere"
    # No key in the terminal's settings: the commands find the one `quarry up` wrote, readable by its user only.
    env = {**os.environ, "COLUMNS": "250", "QUARRY_MODEL_BASE_URL": terminal_model}
    env.pop("QUARRY_API_KEY")
    key_file = first.data_dir / "api-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert first.wait_for("API key:").split() == ["API", "key:", str(key_file), *API_KEY_HINT.split()]
    client = [sys.executable, "-m", "quarry"]
    runs = subprocess.run(
        [*client, "runs", "list", "--data-dir", str(first.data_dir)], env=env, capture_output=True, timeout=60
    )
    assert runs.returncode == 0, runs.stderr
    doctor = subprocess.run(
        [*client, "doctor", "--data-dir", str(first.data_dir)], env=env, capture_output=True, timeout=60
    )
    said = doctor.stdout.decode()
    assert f"API key: the client commands send the key from {key_file}" in " ".join(said.split()), said
    assert key_file.read_text().strip() not in said
    for name, address in addresses.items():
        service = "worker" if name == "worker-1" else name
        assert f"{service} service: {address}: SERVING" in said, said
    # Doctor reports what the running services use, not what its own terminal is set to.
    assert doctor.returncode == 1, said
    assert f"worker model endpoint: {mesh_model} is not reachable" in " ".join(said.split()), said
    assert terminal_model not in said


def log_lines(output: str) -> list[dict[str, str]]:
    """The services' own log lines (JSON) in `quarry up`'s output, in the order they were written."""
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


async def test_two_workers_are_told_apart_ask_finds_up_by_its_data_dir_and_callers_stop_first(
    up: Callable[..., QuarryUp], model: ScriptedModel
) -> None:
    script = Choreography()
    model.default = script
    for task in ("Task one", "Task two"):
        script.add(task, Reply(content="done"))
    calls = tuple(Call("delegate_research", {"objective": task}, task[-3:]) for task in ("Task one", "Task two"))
    script.add(SUPERVISOR, Reply(calls=calls), Reply(content="Both done."))
    script.add(REPORT, Reply(content="Report."))
    # INFO: each service logs when it is asked to stop and when it has stopped.
    mesh = up("--workers", "2", QUARRY_LOG_LEVEL="INFO", **model_env(model))
    addresses = await asyncio.to_thread(mesh.addresses, NAMES | {"worker-2"})
    assert mesh.state().services["worker"] == [addresses["worker-1"], addresses["worker-2"]]
    # The workers share one database, as a deployment's replicas do.
    assert (mesh.data_dir / "worker.db").exists() and not (mesh.data_dir / "worker-2.db").exists()
    ask = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "quarry", "ask", "--json", "--data-dir", str(mesh.data_dir), "Two at once?"],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(ask.communicate(), 60)
    assert ask.returncode == 0, stderr.decode()
    events = [json.loads(line) for line in stdout.decode().splitlines()]
    assert "completed" in events[-1]
    served_by = {
        event["status"]["delegationId"]: event["status"].get("workerId")
        for event in events
        if event.get("status", {}).get("phase") == "RESEARCH_PHASE_WORKER_COMPLETED"
    }
    assert sorted(served_by.values()) == ["worker-1", "worker-2"], events

    mesh.process.send_signal(signal.SIGTERM)
    output = await asyncio.to_thread(mesh.rest_of_output)
    assert mesh.process.wait(30) == 0
    logs = log_lines(output)

    def asked_to_stop(*services: str) -> int:
        """Where the first of them logged that it was asked to stop."""
        return min(
            n for n, line in enumerate(logs) if line["service"] in services and line["message"] == "shutdown requested"
        )

    def stopped(*names: str) -> int:
        """Where the last of them logged that it had stopped."""
        done = {f"stopped {addresses[name]}" for name in names}
        return max(n for n, line in enumerate(logs) if line["message"] in done)

    # Each stage is asked to stop only once the one before it has stopped.
    assert stopped("supervisor") < asked_to_stop("worker")
    assert stopped("worker-1", "worker-2") < asked_to_stop("monitor", "scratchpad")
    stages = [line.split()[1] for line in output.splitlines() if line.startswith("stopped ")]
    assert stages[0] == "supervisor" and set(stages[1:3]) == {"worker-1", "worker-2"}
    assert set(stages[3:]) == {"monitor", "scratchpad"}


def test_a_taken_port_ends_quarry_up_with_one_line_naming_it_the_service_and_ephemeral_ports(tmp_path: Path) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        others = {
            f"QUARRY_{name}_ADDRESS": f"127.0.0.1:{reusable_port()}" for name in ("MONITOR", "WORKER", "SUPERVISOR")
        }
        done = subprocess.run(
            [sys.executable, "-m", "quarry", "up", "--data-dir", str(tmp_path / "data")],
            env={**os.environ, **others, "QUARRY_SCRATCHPAD_ADDRESS": taken, "TMPDIR": str(tmp_path), "COLUMNS": "250"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "add_port.cc" not in output and "chttp2" not in output, "gRPC's own logging is silenced"
    [failed] = [line for line in output.splitlines() if line.startswith("quarry up failed")]
    assert f"scratchpad could not listen on {taken}: the port is in use" in failed, output
    assert failed.endswith("or run `quarry up --ephemeral-ports`")
    assert "Warning" not in output, "nothing but what the user needs"
