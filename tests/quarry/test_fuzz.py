"""Fuzzing every RPC of every service over real gRPC: whatever the request holds, the answer is
never UNKNOWN or INTERNAL (those mean an exception nobody translated).

Requests are built by hypothesis from the message descriptors, so a new field or RPC is fuzzed
without editing this file: strings with NUL bytes, very long ones and page-token-shaped ones,
the extremes of every integer type, enum numbers no release defines, NaN and infinities, nested
messages, repeated and map fields. The services run in this process on SQLite (one mesh for the
module); a streaming RPC is read for at most a few responses, then cancelled. The example count
is bounded and derandomized, so a run is quick and reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import message_factory, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarry.clients.channels import open_channel
from quarry.paging import encode_token
from quarry.v1 import campaign_pb2, diagnostics_pb2, monitor_pb2, scratchpad_pb2, supervisor_pb2, worker_pb2
from tests.quarry.every_service import MONITOR, SCRATCHPAD, every_service

THREAD = "fuzz-thread"  # exists, so Append, Read and Watch get past the lookup
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
DIAGNOSTICS = diagnostics_pb2.DESCRIPTOR.services_by_name["DiagnosticsService"]
SERVICES = [
    scratchpad_pb2.DESCRIPTOR.services_by_name["ScratchpadService"],
    worker_pb2.DESCRIPTOR.services_by_name["WorkerService"],
    supervisor_pb2.DESCRIPTOR.services_by_name["SupervisorService"],
    campaign_pb2.DESCRIPTOR.services_by_name["CampaignService"],
    monitor_pb2.DESCRIPTOR.services_by_name["MonitorService"],
    HEALTH,  # served by every server, like diagnostics; both fuzzed on the scratchpad's
    DIAGNOSTICS,
]
METHODS = [method for service in SERVICES for method in service.methods]
# Per RPC; FUZZ_MAX_EXAMPLES=500 runs a longer search locally.
MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "20"))
MAX_DEPTH = 3  # nested messages deeper than this are left unset
MAX_REPEATED = 3
STREAM_RESPONSES = 2
CALL_SECONDS = 10.0
# A stream that says nothing for this long is waiting, as it should, for something to happen.
STREAM_QUIET_SECONDS = 0.3

# --- strategies from descriptors ---------------------------------------------------------------

_INTEGER_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted(edge for edge in {low, high, 0, 1, -1, 2**31 - 1, 2**53 + 1, -(2**31)} if low <= edge <= high)
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def _strings() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=24),
        st.sampled_from(["", THREAD, "\x00", "a\x00b", "../../etc/passwd", "local", " ", "x" * 70_000]),
        st.just(THREAD),
        st.from_regex(r"[a-z][a-z0-9-]{0,20}(\x00)?", fullmatch=True),  # id-shaped, so validation passes more often
        st.text(max_size=40).map(encode_token),  # a well-formed token around any cursor text
        st.from_regex(r"[0-9]{1,30}", fullmatch=True),
    )


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in _INTEGER_RANGES:
        return _integers(*_INTEGER_RANGES[kind])
    if kind == FieldDescriptor.TYPE_STRING:
        return _strings()
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        edges = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e-45])
        return st.one_of(edges, st.floats(width=32 if kind == FieldDescriptor.TYPE_FLOAT else 64))
    if kind == FieldDescriptor.TYPE_ENUM:
        known = [value.number for value in field.enum_type.values]
        return st.one_of(st.sampled_from(known), _integers(-(2**31), 2**31 - 1))
    raise AssertionError(f"no strategy for {field.full_name} (type {kind})")


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of `descriptor`, each field set or not, oneofs included (the last member set wins)."""
    cls = message_factory.GetMessageClass(descriptor)
    if depth >= MAX_DEPTH:
        return st.just(cls())
    optional = {field.name: _field(field, depth) for field in descriptor.fields}
    return st.fixed_dictionaries({}, optional=optional).map(lambda values: _build(cls, descriptor, values))


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if _is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return st.dictionaries(_single(key, depth + 1), _single(value, depth + 1), max_size=MAX_REPEATED)
    single = _single(field, depth)
    if field.is_repeated:
        return st.lists(single, max_size=MAX_REPEATED)
    return single


def _single(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return st.deferred(lambda: messages(field.message_type, depth + 1))
    return _scalar(field)


def _build(cls: type[Message], descriptor: Descriptor, values: dict[str, Any]) -> Message:
    message = cls()
    for name, value in values.items():
        field = descriptor.fields_by_name[name]
        target = getattr(message, name)
        if _is_map(field):
            for key, item in value.items():
                if isinstance(item, Message):
                    target[key].CopyFrom(item)
                else:
                    target[key] = item
        elif field.is_repeated:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                for item in value:
                    target.add().CopyFrom(item)
            else:
                target.extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            target.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


RUN_ID = "run-" + "0" * 32
CAMPAIGN_ID = "campaign-" + "0" * 32
# The loop that drives fuzzed campaigns only waits (tests/supervisor_svc/campaign_loops.py): nothing runs.
CAMPAIGN_SPEC = (
    'spec { title: "t" brief { goal: "g" constraints: "c" editable_paths: "src" protected_paths: "eval.py" }'
    ' workspace { root: "/nonexistent/quarry-fuzz-workspace" }'
    ' metric { name: "loss" direction: METRIC_DIRECTION_MINIMIZE log_regex: "loss=(\\\\S+)" }'
    ' experiment { command_line: "/nonexistent/quarry-fuzz-program --lr 0.1" wall_clock_limit { seconds: 60 } }'
    " budgets { max_tokens_per_hour: 1000 max_cycles: 3 max_consecutive_failures: 2 }"
    " signals { baseline_runs: 2 rebaseline_every: 5 phase_gate: 0.5 stop_at_phase_gate: true } }"
)
# A valid request per RPC (text format): half the examples start from one and change a field or two,
# so they get past validation to the code behind it.
VALID = {
    "quarry.v1.ScratchpadService.CreateThread": 'thread_id: "fuzz-new" title: "t" request_id: "r1"',
    "quarry.v1.ScratchpadService.GetThread": f'thread_id: "{THREAD}"',
    "quarry.v1.ScratchpadService.Append": (
        f'thread_id: "{THREAD}" request_id: "r1" kind: ENTRY_KIND_NOTE content: "c"'
        ' author { principal_id: "fuzz" role: ROLE_RESEARCHER }'
    ),
    "quarry.v1.ScratchpadService.Read": f'thread_id: "{THREAD}" page_size: 2',
    "quarry.v1.ScratchpadService.Watch": f'thread_id: "{THREAD}"',
    "quarry.v1.WorkerService.Delegate": (
        f'delegation_id: "d1" run_id: "{RUN_ID}" scratchpad_thread_id: "{THREAD}" task {{ objective: "o" }}'
        " role: ROLE_RESEARCHER budget { max_turns: 1 }"
    ),
    "quarry.v1.WorkerService.GetDelegation": 'delegation_id: "d1"',
    "quarry.v1.WorkerService.ExportRecording": f'run_id: "{RUN_ID}"',
    "quarry.v1.SupervisorService.StartRun": 'question: "q" request_id: "r1"',
    "quarry.v1.SupervisorService.StreamRun": f'run_id: "{RUN_ID}"',
    "quarry.v1.SupervisorService.GetRun": f'run_id: "{RUN_ID}"',
    "quarry.v1.SupervisorService.ExportRun": f'run_id: "{RUN_ID}"',
    "quarry.v1.SupervisorService.ListRunLedger": f'run_id: "{RUN_ID}" page_size: 2',
    "quarry.v1.SupervisorService.ListRuns": "page_size: 1",
    "quarry.v1.SupervisorService.CancelRun": f'run_id: "{RUN_ID}" reason: "r"',
    "quarry.v1.SupervisorService.ApproveRun": f'run_id: "{RUN_ID}" comment: "c"',
    "quarry.v1.SupervisorService.RejectRun": f'run_id: "{RUN_ID}" reason: "r"',
    "quarry.v1.CampaignService.StartCampaign": f'{CAMPAIGN_SPEC} request_id: "c1"',
    "quarry.v1.CampaignService.GetCampaign": f'campaign_id: "{CAMPAIGN_ID}"',
    "quarry.v1.CampaignService.ListCampaigns": "page_size: 1 state: CAMPAIGN_STATE_RUNNING",
    "quarry.v1.CampaignService.StreamCampaign": f'campaign_id: "{CAMPAIGN_ID}"',
    "quarry.v1.CampaignService.PauseCampaign": f'campaign_id: "{CAMPAIGN_ID}" reason: "r"',
    "quarry.v1.CampaignService.ResumeCampaign": f'campaign_id: "{CAMPAIGN_ID}" reason: "r"',
    "quarry.v1.CampaignService.StopCampaign": f'campaign_id: "{CAMPAIGN_ID}" reason: "r"',
    "quarry.v1.CampaignService.SendDirective": f'campaign_id: "{CAMPAIGN_ID}" text: "try" request_id: "d1"',
    "quarry.v1.CampaignService.ListLedgerRows": f'campaign_id: "{CAMPAIGN_ID}" page_size: 2',
    "quarry.v1.CampaignService.WriteCampaignReport": f'campaign_id: "{CAMPAIGN_ID}" request_id: "w1"',
    "quarry.v1.CampaignService.GetCampaignReport": f'campaign_id: "{CAMPAIGN_ID}"',
    "quarry.v1.MonitorService.ListGpus": "",
    "quarry.v1.MonitorService.WatchGpus": "interval { seconds: 1 }",
    "quarry.v1.MonitorService.SubmitJob": (
        'local { argv: "/nonexistent/quarry-fuzz-program" } request_id: "j1" options { environment { key: "A"'
        ' value: "1" } wall_clock_limit { seconds: 5 } gpus { count: 0 } metrics { name: "loss"'
        ' direction: METRIC_DIRECTION_MINIMIZE log_regex: "loss=(\\\\S+)" } }'
    ),
    # Watching only: this test's own process.
    "quarry.v1.MonitorService.WatchJob": f"job {{ local {{ pid: {os.getpid()} }} }} poll_interval {{ seconds: 1 }}",
    # WORKSPACE_ROOT and WORKSPACE_ID: the git repository the `workspace` fixture opened.
    "quarry.v1.MonitorService.OpenWorkspace": 'root: "WORKSPACE_ROOT" protected_paths: "eval" request_id: "w1"',
    "quarry.v1.MonitorService.GetWorkspace": 'workspace_id: "WORKSPACE_ID"',
    "quarry.v1.MonitorService.ListWorkspaceTree": 'workspace_id: "WORKSPACE_ID" max_depth: 2',
    "quarry.v1.MonitorService.ReadWorkspaceFile": 'workspace_id: "WORKSPACE_ID" path: "train.py" end_line: 2',
    "quarry.v1.MonitorService.SearchWorkspace": 'workspace_id: "WORKSPACE_ID" pattern: "lr" glob: "*.py"',
    "quarry.v1.MonitorService.WriteWorkspaceFile": 'workspace_id: "WORKSPACE_ID" path: "notes.txt" content: "x"',
    "quarry.v1.MonitorService.PatchWorkspace": (
        'workspace_id: "WORKSPACE_ID" patch: "--- a/train.py\\n+++ b/train.py\\n@@ -1 +1 @@\\n-lr = 1\\n+lr = 2\\n"'
    ),
    "quarry.v1.MonitorService.CreateWorkspaceBranch": 'workspace_id: "WORKSPACE_ID" branch: "fuzz"',
    "quarry.v1.MonitorService.DiffWorkspace": 'workspace_id: "WORKSPACE_ID"',
    "quarry.v1.MonitorService.CommitWorkspace": 'workspace_id: "WORKSPACE_ID" message: "m"',
    "quarry.v1.MonitorService.ResetWorkspace": 'workspace_id: "WORKSPACE_ID" commit: "HEAD"',
    "grpc.health.v1.Health.Check": 'service: ""',
    "grpc.health.v1.Health.List": "",
    "grpc.health.v1.Health.Watch": 'service: ""',
    "quarry.v1.DiagnosticsService.GetDiagnostics": "",
}


def _mutations(descriptor: Descriptor, valid: Message) -> st.SearchStrategy[Message]:
    """`valid` with up to two of its fields replaced by fuzzed values."""
    names = st.lists(st.sampled_from([field.name for field in descriptor.fields]), min_size=1, max_size=2, unique=True)
    cls = type(valid)

    def replaced(chosen: list[str]) -> st.SearchStrategy[Message]:
        fields = {name: _field(descriptor.fields_by_name[name], 0) for name in chosen}
        return st.fixed_dictionaries(fields).map(lambda values: _merged(valid, _build(cls, descriptor, values), chosen))

    return names.flatmap(replaced)


def _merged(valid: Message, changes: Message, names: list[str]) -> Message:
    merged = type(valid)()
    merged.CopyFrom(valid)
    for name in names:
        merged.ClearField(name)
    merged.MergeFrom(changes)
    return merged


def _requests(method: MethodDescriptor, workspace: Workspace) -> st.SearchStrategy[Message]:
    cls = message_factory.GetMessageClass(method.input_type)
    text = VALID[method.full_name].replace("WORKSPACE_ROOT", workspace.root).replace("WORKSPACE_ID", workspace.id)
    valid = text_format.Parse(text, cls())
    strategy = messages(method.input_type)
    if method.input_type.fields:
        strategy = st.one_of(strategy, _mutations(method.input_type, valid))
    if method.full_name == "quarry.v1.MonitorService.SubmitJob":
        # The monitor runs local commands: never a program of the fuzzer's choosing, whatever else varies.
        strategy = strategy.map(_harmless_program)
    return strategy


def _harmless_program(request: Message) -> Message:
    assert isinstance(request, monitor_pb2.SubmitJobRequest)
    for kind in ("local", "remote"):
        if request.HasField(kind):
            command = getattr(request, kind)
            if command.argv:
                command.argv[0] = "/nonexistent/quarry-fuzz-program"
            if command.command_line:
                command.command_line = "/nonexistent/quarry-fuzz-program " + command.command_line
    return request


# --- the calls -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    code: grpc.StatusCode
    details: str


@dataclass(frozen=True)
class Workspace:
    root: str
    id: str


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def channels(fuzz_dir: Path) -> AsyncIterator[dict[str, grpc.aio.Channel]]:
    """A channel to each service, by full service name (Health and diagnostics: the scratchpad's server)."""
    tmp_path = fuzz_dir
    async with every_service(tmp_path) as services, contextlib.AsyncExitStack() as stack:
        channels = {
            name: await stack.enter_async_context(open_channel(address, token=services.token(name)))
            for name, address in services.addresses.items()
        }
        channels[HEALTH.full_name] = channels[DIAGNOSTICS.full_name] = channels[SCRATCHPAD]
        create = channels[SCRATCHPAD].unary_unary(
            f"/{SCRATCHPAD}/CreateThread",
            request_serializer=scratchpad_pb2.CreateThreadRequest.SerializeToString,
            response_deserializer=scratchpad_pb2.CreateThreadResponse.FromString,
        )
        await create(scratchpad_pb2.CreateThreadRequest(thread_id=THREAD, title="fuzz"), timeout=CALL_SECONDS)
        yield channels


@pytest.fixture(scope="module")
def repository(fuzz_dir: Path) -> Path:
    """A git repository under the monitor's workspace root."""
    root = fuzz_dir / "workspaces" / "project"
    (root / "eval").mkdir(parents=True)
    (root / "train.py").write_text("lr = 1\nprint(lr)\n")
    (root / "eval" / "score.py").write_text("SCORE = 1\n")
    identity = ["-c", "user.name=fuzz", "-c", "user.email=fuzz@example.com"]
    for command in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-qm", "initial"]):
        subprocess.run(["git", "-C", str(root), *command], check=True)
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workspace(channels: dict[str, grpc.aio.Channel], repository: Path) -> Workspace:
    """The repository opened as a workspace: the fuzzed workspace RPCs act on it."""
    root = repository
    open_workspace = channels[MONITOR].unary_unary(
        f"/{MONITOR}/OpenWorkspace",
        request_serializer=monitor_pb2.OpenWorkspaceRequest.SerializeToString,
        response_deserializer=monitor_pb2.OpenWorkspaceResponse.FromString,
    )
    opened = await open_workspace(
        monitor_pb2.OpenWorkspaceRequest(root=str(root), protected_paths=["eval"]), timeout=CALL_SECONDS
    )
    return Workspace(str(root), opened.workspace.workspace_id)


def _response_class(method: MethodDescriptor) -> type[Message]:
    return message_factory.GetMessageClass(method.output_type)


async def _call(channel: grpc.aio.Channel, method: MethodDescriptor, request: Message) -> Answer:
    path = f"/{method.containing_service.full_name}/{method.name}"
    serializer, deserializer = type(request).SerializeToString, _response_class(method).FromString
    try:
        if not method.server_streaming:
            unary = channel.unary_unary(path, request_serializer=serializer, response_deserializer=deserializer)
            await unary(request, timeout=CALL_SECONDS)
            return Answer(grpc.StatusCode.OK, "")
        stream = channel.unary_stream(path, request_serializer=serializer, response_deserializer=deserializer)
        call = stream(request, timeout=CALL_SECONDS)
        try:
            for _ in range(STREAM_RESPONSES):
                try:
                    response = await asyncio.wait_for(call.read(), STREAM_QUIET_SECONDS)
                except TimeoutError:
                    # Still open and waiting (the timeout cancelled the call): fine.
                    return Answer(grpc.StatusCode.OK, "open")
                if response is grpc.aio.EOF:
                    return Answer(await call.code(), await call.details() or "")
        finally:
            call.cancel()
        return Answer(grpc.StatusCode.OK, "streaming")
    except grpc.aio.AioRpcError as error:
        return Answer(error.code(), error.details() or "")


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("method", METHODS, ids=[method.full_name for method in METHODS])
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
async def test_no_request_gets_unknown_or_internal(
    channels: dict[str, grpc.aio.Channel], workspace: Workspace, method: MethodDescriptor, data: st.DataObject
) -> None:
    request = data.draw(_requests(method, workspace), label="request")
    answer = await _call(channels[method.containing_service.full_name], method, request)
    assert answer.code not in {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}, (
        f"{method.full_name} answered {answer.code.name} ({answer.details}) to {_shown(request)}"
    )


def _shown(request: Message) -> str:
    text = repr(request)
    return text if len(text) < 2000 else text[:2000] + f"... ({len(text)} characters)"


def test_every_rpc_has_a_valid_request() -> None:
    assert {method.full_name for method in METHODS} == set(VALID)


def test_the_strategies_reach_the_edges() -> None:
    """The generator itself: NUL bytes, unknown enum numbers and extreme integers are among its values."""
    seen: dict[str, bool] = {"nul": False, "unknown enum": False, "huge int": False, "nan": False}

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(request=messages(scratchpad_pb2.ReadRequest.DESCRIPTOR), value=_scalar(_DOUBLE))
    def collect(request: scratchpad_pb2.ReadRequest, value: float) -> None:
        known = set(scratchpad_pb2.EntryKind.values())
        seen["nul"] |= "\x00" in request.thread_id
        seen["unknown enum"] |= any(kind not in known for kind in request.kinds)
        seen["huge int"] |= abs(request.after_sequence_no) >= 2**62
        seen["nan"] |= math.isnan(value)

    collect()
    assert seen == dict.fromkeys(seen, True)


_DOUBLE = monitor_pb2.Gpu.DESCRIPTOR.fields_by_name["power_watts"]
