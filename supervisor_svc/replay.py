"""`quarry runs replay`: re-executes a recorded run (a .qrun file) with no model and no network.

A private mesh runs in this process: a scratchpad, the recorded number of workers and a supervisor, each
on a loopback port and a fresh SQLite database, authenticated like any mesh (fresh mesh credentials and
API keys named as the recorded principals), and configured with the recorded services' settings. Every
HTTP request their agents send is answered from the recording (quarry.replay.source). The run is started
with the recorded question and options, takes the recorded approval decision if it waits for one, and
its events and final state are compared with the recorded ones. The outcome is the first divergence:
a request the recording lacks, else the first differing event or field, else a recorded step the
replay never asked for; or none, when the replay is exact.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from quarry.api_auth import ALL_ROLES, new_api_key, static_key_entry
from quarry.clients.runs import RunsClient
from quarry.config import QuarrySettings, ScratchpadSettings, SupervisorSettings, WorkerSettings
from quarry.identity import ApiRole, MeshRole
from quarry.mesh_auth import MeshKeys
from quarry.recording import replaying
from quarry.replay.compare import run_difference
from quarry.replay.qrun import RecordingError, RunRecording, read
from quarry.replay.source import ReplaySource
from quarry.v1 import supervisor_pb2
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.service import build_host as build_supervisor
from worker_svc.service import build_host as build_worker

# Where the replay's agents believe their model is when the recording does not say (the recorded address is
# used otherwise, since errors quote it): never reached, every request is answered from the recording.
REPLAY_MODEL_URL = "http://model.replay.invalid/v1"
# A replay that has not ended by then has hung on something the recording cannot answer.
REPLAY_SECONDS = 600.0


@dataclass
class ReplayOutcome:
    run: dict[str, Any]
    events: list[dict[str, Any]]
    # The first place the replay departs from the recording; None when it is exact.
    divergence: str | None
    # Recorded steps the replay never asked for (numbered from 1).
    unasked: list[int] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.divergence is None


def _keys(recording: RunRecording) -> tuple[str, str, str]:
    """A starter's and an approver's key, as the principals the recording names, and their settings entry."""
    starter, approver = new_api_key(), new_api_key()
    starter_name = recording.run.get("createdBy") or "replay"
    approver_name = recording.run.get("decidedBy") or "replay-approver"
    if approver_name == starter_name:
        entries = [static_key_entry(starter_name, ALL_ROLES, starter)]
        approver = starter
    else:
        entries = [
            static_key_entry(starter_name, ALL_ROLES, starter),
            static_key_entry(approver_name, {ApiRole.APPROVER}, approver),
        ]
    return starter, approver, ",".join(entries)


async def replay(recording: RunRecording, workdir: Path) -> ReplayOutcome:
    """Re-executes the recorded run in a private mesh under `workdir`; its outcome against the recording."""
    source = ReplaySource(recording)
    mesh_keys = MeshKeys.generate()
    starter_key, approver_key, api_keys = _keys(recording)

    def common(role: MeshRole | None) -> QuarrySettings:
        """The scratchpad calls no one: it has the peers and no token of its own."""
        return QuarrySettings(
            data_dir=workdir,
            mesh_token=mesh_keys.tokens[role] if role else "",
            mesh_peers=mesh_keys.peers().render(),
            shutdown_grace_seconds=1,
        )

    with replaying(source):
        scratchpad_settings = ScratchpadSettings(
            address="127.0.0.1:0", database_url=f"sqlite:///{workdir}/scratchpad.db"
        )
        async with (
            await build_scratchpad(scratchpad_settings, common(None)) as scratchpad,
            contextlib.AsyncExitStack() as workers,
        ):
            addresses = []
            for number, recorded in enumerate(recording.workers or [{}], 1):
                worker_settings = WorkerSettings(
                    **{
                        **recorded,
                        "address": "127.0.0.1:0",
                        "database_url": f"sqlite:///{workdir}/worker{number}.db",
                        "scratchpad_address": scratchpad.address,
                        "model_base_url": recorded.get("model_base_url", REPLAY_MODEL_URL),
                        "corpus_index": str(workdir / "corpus.db"),
                        "page_extract_workers": 1,  # enough for one run, and its processes start faster
                    }
                )
                worker = await workers.enter_async_context(await build_worker(worker_settings, common(MeshRole.WORKER)))
                addresses.append(worker.address)
            settings = SupervisorSettings(
                **{
                    **recording.settings,
                    "address": "127.0.0.1:0",
                    "database_url": f"sqlite:///{workdir}/supervisor.db",
                    "scratchpad_address": scratchpad.address,
                    "worker_addresses": ",".join(addresses),
                    "model_base_url": recording.settings.get("model_base_url", REPLAY_MODEL_URL),
                    "api_keys": api_keys,
                }
            )
            async with (
                await build_supervisor(settings, common(MeshRole.SUPERVISOR)) as supervisor,
                RunsClient.connect(supervisor.address, api_key=starter_key) as client,
                RunsClient.connect(supervisor.address, api_key=approver_key) as approver,
            ):
                async with asyncio.timeout(REPLAY_SECONDS):
                    run, events = await _execute(recording, source, client, approver)
    divergence = source.first_divergence()
    found = str(divergence) if divergence else run_difference(recording, run, events, source.ids())
    unasked = source.unserved()
    if found is None and unasked:
        found = f"step {unasked[0]}: the replay never made this recorded request ({source.describe(unasked[0])})"
    return ReplayOutcome(run, events, found, unasked)


async def _execute(
    recording: RunRecording, source: ReplaySource, client: RunsClient, approver: RunsClient
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    recorded = supervisor_pb2.Run()
    json_format.ParseDict(recording.run, recorded, ignore_unknown_fields=True)
    started = await client.start_run(recorded.question, options=recorded.options, labels=recorded.labels)
    source.learn_id(recorded.run_id, started.run_id)
    source.learn_id(recorded.scratchpad_thread_id, started.scratchpad_thread_id)
    events: list[supervisor_pb2.RunEvent] = []
    async for event in client.stream_run(started.run_id):
        events.append(event)
        if event.HasField("status") and event.status.phase == supervisor_pb2.RESEARCH_PHASE_AWAITING_APPROVAL:
            await _decide(recording.approval, approver, started.run_id)
    final = await client.get_run(started.run_id)
    return json_format.MessageToDict(final), [json_format.MessageToDict(event) for event in events]


async def _decide(approval: Mapping[str, str] | None, approver: RunsClient, run_id: str) -> None:
    """The recorded decision, taken again; a run recorded before any decision is left waiting (and ends as its
    own wait does)."""
    if approval is None:
        return
    if approval["decision"] == "approved":
        await approver.approve_run(run_id, approval["note"])
    else:
        await approver.reject_run(run_id, approval["note"])


def run(args: argparse.Namespace) -> int:
    """The command: replays `args.file`; 0 when the replay is exact, 1 when it diverges, 2 when it cannot run."""
    try:
        recording = read(args.file)
    except RecordingError as error:
        print(f"quarry runs replay: {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="quarry-replay-") as workdir:
        outcome = asyncio.run(replay(recording, Path(workdir)))
    steps = len(recording.exchanges)
    if outcome.exact:
        print(f"replayed {recording.run_id} exactly: {len(outcome.events)} events, {steps} recorded exchanges")
        return 0
    print(f"replay of {recording.run_id} diverged at {outcome.divergence}", file=sys.stderr)
    return 1
