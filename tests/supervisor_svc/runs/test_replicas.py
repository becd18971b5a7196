"""Two supervisor replicas on one PostgreSQL: a run executed by one streams promptly from the other."""

from __future__ import annotations

import asyncio
from pathlib import Path

from quarry.client import QuarryClient
from quarry.config import QuarrySettings, ScratchpadSettings, SupervisorSettings
from quarry.v1 import supervisor_pb2
from scratchpad_svc.service import build_host as build_scratchpad
from supervisor_svc.service import build_host as build_supervisor
from tests.conftest import postgres_schema, reusable_port
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography
from tests.fakes.openai_server import Reply, ScriptedModel


async def test_a_stream_on_another_replica_is_woken_by_postgres_notify(tmp_path: Path, model: ScriptedModel) -> None:
    script = Choreography()
    model.default = script
    script.add(SUPERVISOR, Reply(content="Nothing to delegate.", delay=1.0))
    script.add(REPORT, Reply(content="The report, a while later.", delay=1.0))
    common = QuarrySettings(data_dir=tmp_path, shutdown_grace_seconds=1)
    with postgres_schema() as schema:
        async with await build_scratchpad(ScratchpadSettings(address="127.0.0.1:0"), common) as scratchpad:

            def replica() -> SupervisorSettings:
                return SupervisorSettings(
                    address="127.0.0.1:0",
                    database_url=schema.url,
                    scratchpad_address=scratchpad.address,
                    worker_addresses=f"127.0.0.1:{reusable_port()}",  # this run delegates nothing
                    model_base_url=model.base_url,
                    model_name="scripted",
                    stream_poll_seconds=60,  # no timer wake-ups: only a NOTIFY can wake the stream in time
                    verify_runs=False,  # the script covers the research phase only
                )

            first = await build_supervisor(replica(), common)
            second = await build_supervisor(replica(), common)
            async with (
                first,
                second,
                QuarryClient.connect(first.address) as a,
                QuarryClient.connect(second.address) as b,
            ):
                run = await a.start_run("Who runs this?")
                events = await asyncio.wait_for(_collect(b, run.run_id), 30)
                here = [event async for event in a.stream_run(run.run_id)]
    assert events == here, "both replicas serve the same log"
    assert events[-1].completed.report.markdown == "The report, a while later."


async def _collect(client: QuarryClient, run_id: str) -> list[supervisor_pb2.RunEvent]:
    return [event async for event in client.stream_run(run_id)]
