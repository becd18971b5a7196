"""CampaignService over real gRPC (the supervisor's host, in this process) and Campaigns on a shared database:
idempotent starts, paging, the pause/resume/stop state machine, directives consumed once, resumable
streams, and leases taken over by another instance. Each test runs on SQLite and PostgreSQL.

The loop is a stand-in (tests/supervisor_svc/campaign_loops.py): these tests are about the API and
the durable state around whatever loop drives a campaign.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from quarry.db import Database
from quarry.errors import DatabaseUnavailable, ErrorReason, InvalidArgument, Unimplemented
from quarry.migrations import open_migrated_database
from quarry.notify import CommitSignal
from quarry.records.campaign import TrialRecord, Verdict
from quarry.records.contract import signals_to_proto
from quarry.records.signals import read_signals
from quarry.v1 import campaign_pb2
from supervisor_svc.campaigns.service import MAX_ACTIVE_CAMPAIGNS, CampaignHandle, CampaignLoop, Campaigns
from supervisor_svc.campaigns.servicer import spec_from_proto, spec_to_proto
from supervisor_svc.campaigns.spec import validate_spec
from supervisor_svc.campaigns.state import CampaignState, Phase, Progress
from supervisor_svc.campaigns.store import CampaignLost, CampaignStore
from supervisor_svc.hosting.host import HostLimits
from supervisor_svc.schema import campaigns as campaigns_table
from supervisor_svc.service import MIGRATIONS, VERSION_TABLE
from tests.fakes.openai_server import ScriptedModel
from tests.rpc import error_reason, expect_error, violations
from tests.supervisor_svc.campaign_loops import ServedCampaigns as Served
from tests.supervisor_svc.campaign_loops import WaitingLoops, campaign_spec, serve_campaigns

PAUSED = campaign_pb2.CAMPAIGN_STATE_PAUSED
spec = campaign_spec


@pytest.fixture
async def served(tmp_path: Path, database_url: str, model: ScriptedModel) -> AsyncIterator[Served]:
    async with serve_campaigns(tmp_path, database_url, model) as served:
        yield served


async def test_a_start_is_idempotent_by_request_id(served: Served) -> None:
    first = await served.client.start_campaign(spec(), request_id="start-1")
    again = await served.client.start_campaign(spec(), request_id="start-1")
    assert again.campaign_id == first.campaign_id
    assert first.state == campaign_pb2.CAMPAIGN_STATE_QUEUED and first.phase == campaign_pb2.CAMPAIGN_PHASE_IDLE
    assert first.branch == f"quarry/{first.campaign_id}" and first.scratchpad_thread_id == first.campaign_id
    assert list(first.spec.experiment.argv) == ["python3", "train.py", "--config", "a b.toml"]
    assert not first.spec.experiment.command_line, "the campaign keeps the command as argv"
    assert first.spec.signals.baseline_runs == 3 and first.spec.budgets.max_consecutive_failures == 5
    handle = await served.loops.next_started()
    assert handle.campaign_id == first.campaign_id
    assert served.loops.started.empty(), "one campaign, one loop"
    refused = await expect_error(
        served.client.start_campaign(spec("Something else."), request_id="start-1"), grpc.StatusCode.ALREADY_EXISTS
    )
    assert error_reason(refused) == ErrorReason.REQUEST_ID_REUSED


async def test_a_bad_spec_is_refused_field_by_field(served: Served) -> None:
    message = spec(goal=" ")
    message.workspace.root = "relative/path"
    message.metric.log_regex = "val_loss=\\S+"  # no capture group
    message.experiment.argv.append("python3")  # and command_line too
    message.experiment.ClearField("wall_clock_limit")
    message.brief.protected_paths.append("../outside")
    message.signals.baseline_runs = 1
    refused = await expect_error(served.client.start_campaign(message), grpc.StatusCode.INVALID_ARGUMENT)
    assert set(violations(refused)) == {
        "spec.brief.goal",
        "spec.workspace.root",
        "spec.metric.log_regex",
        "spec.experiment.command_line",
        "spec.experiment.wall_clock_limit",
        "spec.brief.protected_paths[1]",
        "spec.signals.baseline_runs",
    }
    assert served.loops.started.empty()


async def test_get_and_list_page_newest_first_and_filter_by_state(served: Served) -> None:
    started = [await served.client.start_campaign(spec(f"Goal {n}.")) for n in range(3)]
    got = await served.client.get_campaign(started[0].campaign_id)
    assert got.spec.brief.goal == "Goal 0."
    first = await served.client.list_campaigns(page_size=2)
    assert [c.campaign_id for c in first.campaigns] == [started[2].campaign_id, started[1].campaign_id]
    rest = await served.client.list_campaigns(page_size=2, page_token=first.next_page_token)
    assert [c.campaign_id for c in rest.campaigns] == [started[0].campaign_id] and not rest.next_page_token
    await served.client.pause_campaign(started[1].campaign_id, "look")
    paused = await served.client.list_campaigns(state=PAUSED)
    assert [c.campaign_id for c in paused.campaigns] == [started[1].campaign_id]
    mixed = served.client.list_campaigns(page_size=2, page_token=first.next_page_token, state=PAUSED)
    assert "page_token" in violations(await expect_error(mixed, grpc.StatusCode.INVALID_ARGUMENT))
    missing = await expect_error(served.client.get_campaign("campaign-" + "0" * 32), grpc.StatusCode.NOT_FOUND)
    assert error_reason(missing) == ErrorReason.CAMPAIGN_NOT_FOUND


async def test_pause_resume_and_stop_move_the_campaign_and_its_loop(served: Served) -> None:
    campaign = await served.client.start_campaign(spec())
    campaign_id = campaign.campaign_id
    await served.loops.next_started()
    running = await served.client.get_campaign(campaign_id)
    assert running.state == campaign_pb2.CAMPAIGN_STATE_RUNNING and running.phase == campaign_pb2.CAMPAIGN_PHASE_THINK
    assert running.cycle == 1

    paused = await served.client.pause_campaign(campaign_id, "  checking the data  ")
    assert paused.state == PAUSED and paused.pause_reason == "checking the data"
    assert served.loops.cancelled == [campaign_id], "a paused campaign has no loop"
    assert paused.phase == campaign_pb2.CAMPAIGN_PHASE_THINK, "the phase says where to resume"
    assert (await served.client.pause_campaign(campaign_id, "again")).pause_reason == "checking the data", "a no-op"

    resumed = await served.client.resume_campaign(campaign_id, "data fixed")
    assert resumed.state == campaign_pb2.CAMPAIGN_STATE_QUEUED and not resumed.pause_reason
    handle = await served.loops.next_started()
    assert handle.record.phase is Phase.THINK and handle.record.resume_time is not None
    assert (await served.client.resume_campaign(campaign_id)).state == campaign_pb2.CAMPAIGN_STATE_RUNNING, "a no-op"

    stopped = await served.client.stop_campaign(campaign_id, "enough")
    assert stopped.state == campaign_pb2.CAMPAIGN_STATE_STOPPED and stopped.end_reason == "enough"
    assert stopped.HasField("end_time") and served.loops.cancelled == [campaign_id, campaign_id]
    assert (await served.client.stop_campaign(campaign_id, "twice")).end_reason == "enough", "a no-op"
    for refused_call in (
        served.client.pause_campaign(campaign_id),
        served.client.resume_campaign(campaign_id),
        served.client.send_directive(campaign_id, "try dropout"),
    ):
        refused = await expect_error(refused_call, grpc.StatusCode.FAILED_PRECONDITION)
        assert error_reason(refused) == ErrorReason.CAMPAIGN_ENDED

    kinds = [event.WhichOneof("payload") for event in await served.events(campaign_id)]
    assert kinds == ["phase_changed", "paused", "resumed", "phase_changed", "ended"]


async def test_a_directive_is_idempotent_and_consumed_exactly_once(served: Served) -> None:
    campaign = await served.client.start_campaign(spec())
    handle = await served.loops.next_started()
    sent = await served.client.send_directive(campaign.campaign_id, "Try a smaller learning rate.", request_id="d-1")
    again = await served.client.send_directive(campaign.campaign_id, "Try a smaller learning rate.", request_id="d-1")
    assert sent == again and sent.state == campaign_pb2.DIRECTIVE_STATE_PENDING
    assert sent.sent_by == "tester" and campaign.created_by == "tester"  # the principal of the client's key
    reused = served.client.send_directive(campaign.campaign_id, "Something else.", request_id="d-1")
    assert error_reason(await expect_error(reused, grpc.StatusCode.ALREADY_EXISTS)) == ErrorReason.REQUEST_ID_REUSED
    await served.client.send_directive(campaign.campaign_id, "Then try warmup.", request_id="d-2")
    assert (await served.client.get_campaign(campaign.campaign_id)).pending_directives == 2

    pending = await handle.pending_directives()
    assert [directive.text for directive in pending] == ["Try a smaller learning rate.", "Then try warmup."]
    first, second = await asyncio.gather(
        handle.consume_directives(["d-1", "d-2"], cycle=1), handle.consume_directives(["d-1", "d-2"], cycle=1)
    )
    assert sorted(d.request_id for d in [*first, *second]) == ["d-1", "d-2"], "each given to one THINK only"
    assert await handle.consume_directives(["d-1", "d-2"], cycle=2) == []
    assert await handle.pending_directives() == []
    assert (await served.client.get_campaign(campaign.campaign_id)).pending_directives == 0
    consumed = await served.client.send_directive(
        campaign.campaign_id, "Try a smaller learning rate.", request_id="d-1"
    )
    assert consumed.state == campaign_pb2.DIRECTIVE_STATE_CONSUMED and consumed.consumed_cycle == 1

    await served.client.stop_campaign(campaign.campaign_id)
    stream = await served.events(campaign.campaign_id)
    kinds = [event.WhichOneof("payload") for event in stream]
    assert kinds.count("directive_received") == 2 and kinds.count("directive_consumed") == 2
    assert {e.directive_received.sent_by for e in stream if e.HasField("directive_received")} == {"tester"}


async def test_the_stream_resumes_after_a_sequence_number_and_ends_with_the_campaign(served: Served) -> None:
    campaign = await served.client.start_campaign(spec())
    handle = await served.loops.next_started()
    now = datetime.now(UTC)
    ledger = TrialRecord(
        cycle=1,
        hypothesis="the unchanged state",
        action="baseline",
        metrics={"val_loss": 0.5},
        verdict=Verdict.BASELINE,
        started_at=now,
        ended_at=now,
    )

    async def follow() -> list[campaign_pb2.CampaignEvent]:
        return await served.events(campaign.campaign_id)

    live = asyncio.create_task(follow())
    assert await handle.record_trial(ledger, Progress(best_value=0.5))
    assert not await handle.record_trial(ledger, Progress(best_value=0.5)), "one ledger row per cycle"
    await handle.record_usage(120)
    await handle.finish(CampaignState.COMPLETED, "the cycle budget is spent")
    served.loops.release.set()
    events = await asyncio.wait_for(live, 10)
    assert [event.sequence_no for event in events] == list(range(1, len(events) + 1))
    assert [event.WhichOneof("payload") for event in events] == ["phase_changed", "ledger_recorded", "ended"]
    assert events[1].ledger_recorded.metrics[0].value == 0.5
    assert events[-1].ended.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED

    assert await served.events(campaign.campaign_id, after=1) == events[1:], "resumed after a sequence number"
    assert await served.events(campaign.campaign_id, after=len(events)) == [], "nothing after the end"
    done = await served.client.get_campaign(campaign.campaign_id)
    assert done.state == campaign_pb2.CAMPAIGN_STATE_COMPLETED and done.best_value == 0.5
    assert (done.usage.tokens, done.usage.tokens_last_hour, done.usage.cycles) == (120, 120, 1)
    ahead = await expect_error(
        served.events(campaign.campaign_id, after=len(events) + 1), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "after_sequence_no" in violations(ahead)


# -- Campaigns on a shared database ---------------------------------------------------------------------


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    database = await open_migrated_database(database_url, MIGRATIONS, VERSION_TABLE)
    yield database
    await database.close()


def campaigns_on(database: Database, loops: WaitingLoops | None, lease_seconds: float = 30.0) -> Campaigns:
    limits = HostLimits(max_active=MAX_ACTIVE_CAMPAIGNS, lease_seconds=lease_seconds, stream_poll_seconds=0.1)
    return Campaigns(CampaignStore(database), loops, limits, CommitSignal())


async def test_get_gives_the_signals_and_the_ledger_is_read_in_pages_each_row_with_the_signals_after_it(
    served: Served,
) -> None:
    campaign = await served.client.start_campaign(spec())
    handle = await served.loops.next_started()
    now = datetime.now(UTC)
    verdicts = [Verdict.BASELINE] * 3 + [Verdict.KEEP, Verdict.DISCARD]
    ledger = [
        TrialRecord(
            cycle=cycle,
            hypothesis=f"h{cycle}",
            action="a",
            commit=f"{cycle:040x}",
            metrics={"val_loss": value},
            verdict=verdict,
            started_at=now,
            ended_at=now,
        )
        for cycle, (verdict, value) in enumerate(zip(verdicts, [0.50, 0.52, 0.51, 0.40, 0.45], strict=True), start=1)
    ]
    for record in ledger:
        assert await handle.record_trial(record)
    kept = spec_from_proto(campaign.spec)
    goal, rules = kept.metric.goal, kept.signal_rules()

    got = await served.client.get_campaign(campaign.campaign_id)
    assert got.signals == signals_to_proto(read_signals(ledger, goal, rules))
    assert (got.signals.best_value, got.signals.experiments, got.signals.experiments_since_keep) == (0.40, 2, 1)
    listed = await served.client.list_campaigns()
    assert not listed.campaigns[0].HasField("signals"), "a listing does not read every campaign's ledger"

    rows, token, pages = [], "", 0
    while True:
        page = await served.client.list_ledger_rows(campaign.campaign_id, page_size=2, page_token=token)
        rows.extend(page.rows)
        pages, token = pages + 1, page.next_page_token
        if not token:
            break
    assert pages == 3 and [row.cycle for row in rows] == [1, 2, 3, 4, 5]
    for index, row in enumerate(rows):
        assert row.signals == signals_to_proto(read_signals(ledger[: index + 1], goal, rules))
    assert await served.client.ledger(campaign.campaign_id) == rows
    first = await served.client.list_ledger_rows(campaign.campaign_id, page_size=2)
    other = await served.client.start_campaign(spec("Another goal."))
    for bad in ("not-a-token", first.next_page_token):  # the second is another campaign's
        refused = await expect_error(
            served.client.list_ledger_rows(other.campaign_id, page_token=bad), grpc.StatusCode.INVALID_ARGUMENT
        )
        assert list(violations(refused)) == ["page_token"]


async def test_a_campaign_whose_driver_stops_renewing_is_taken_over_and_the_old_driver_is_fenced(
    database: Database,
) -> None:
    old_loops, new_loops = WaitingLoops(), WaitingLoops()
    # Never started, so its leases are never renewed: a replica that hangs, or died.
    stalled = campaigns_on(database, old_loops, lease_seconds=1)
    survivor = campaigns_on(database, new_loops, lease_seconds=1)
    try:
        record = await stalled.start_campaign(spec_from_proto(spec()), "")
        old = await old_loops.next_started()
        await survivor.start()
        new = await new_loops.next_started(within=15)
        assert new.campaign_id == record.campaign_id
        assert new.record.phase is Phase.THINK and new.record.cycle == 1, "resumed where it was"
        with pytest.raises(CampaignLost):
            await old.set_phase(Phase.EXECUTE, 1)
        await new.set_phase(Phase.EXECUTE, 1)
        assert (await survivor.get(record.campaign_id)).phase is Phase.EXECUTE
    finally:
        old_loops.release.set()
        new_loops.release.set()
        await survivor.close(end_within=1)
        await stalled.close(end_within=1)


async def test_a_closed_instance_gives_up_its_leases_so_another_takes_over_at_once(database: Database) -> None:
    first_loops, second_loops = WaitingLoops(), WaitingLoops()
    first = campaigns_on(database, first_loops)  # a lease of 30 s, which nobody waits out
    second = campaigns_on(database, second_loops)
    await first.start()
    record = await first.start_campaign(spec_from_proto(spec()), "")
    await first_loops.next_started()
    await first.close(end_within=1)
    assert first_loops.cancelled == [record.campaign_id]
    await second.start()
    try:
        handle = await second_loops.next_started()
        assert handle.campaign_id == record.campaign_id
    finally:
        second_loops.release.set()
        await second.close(end_within=1)


async def test_a_loop_that_raises_or_returns_without_an_end_fails_its_campaign(database: Database) -> None:
    loops = WaitingLoops()
    campaigns = campaigns_on(database, loops)
    await campaigns.start()
    try:
        record = await campaigns.start_campaign(spec_from_proto(spec()), "")
        await loops.next_started()
        loops.release.set()  # the loop returns, the campaign still running
        for _ in range(100):
            ended = await campaigns.get(record.campaign_id)
            if ended.state.ended:
                break
            await asyncio.sleep(0.05)
        assert ended.state is CampaignState.FAILED
        assert ended.end_reason == "the campaign loop returned without ending or pausing the campaign"
    finally:
        await campaigns.close(end_within=1)


async def test_without_a_loop_a_campaign_cannot_start(database: Database) -> None:
    with pytest.raises(Unimplemented) as refused:
        await campaigns_on(database, None).start_campaign(spec_from_proto(spec()), "")
    assert refused.value.reason is ErrorReason.CAMPAIGN_LOOP_MISSING


async def test_tokens_leave_the_last_hour_but_stay_in_the_total(database: Database) -> None:
    loops = WaitingLoops()
    campaigns = campaigns_on(database, loops)
    try:
        record = await campaigns.start_campaign(spec_from_proto(spec()), "")
        handle = await loops.next_started()
        await handle.record_usage(50)
        # As if an hour had passed: the window's minutes move back 61 minutes.
        window = campaigns_table.c.usage_window
        where = campaigns_table.c.campaign_id == record.campaign_id
        used = await database.read(lambda connection: connection.execute(sa.select(window).where(where)).scalar_one())
        earlier = [[minute - 61, tokens] for minute, tokens in used]
        await database.write(
            lambda connection: connection.execute(sa.update(campaigns_table).where(where).values(usage_window=earlier))
        )
        await handle.record_usage(7)
        later = await campaigns.get(record.campaign_id)
        assert (later.tokens, later.tokens_last_hour) == (57, 7)
    finally:
        loops.release.set()
        await campaigns.close(end_within=1)


def test_a_stop_time_in_the_past_is_refused() -> None:
    message = spec()
    message.budgets.stop_time.FromDatetime(datetime.now(UTC) - timedelta(minutes=1))
    with pytest.raises(InvalidArgument) as refused:
        validate_spec(spec_from_proto(message), datetime.now(UTC))
    assert [violation.field for violation in refused.value.violations] == ["spec.budgets.stop_time"]


def test_a_slurm_experiment_needs_a_login_host_a_script_inside_the_workspace_and_no_command() -> None:
    message = spec()  # on the monitor's machine, with a command line
    message.experiment.slurm.script_path = "../train.sh"
    message.experiment.slurm.sbatch_args.extend(["", "--x\x00"])
    message.experiment.gpus.indices.append(0)
    with pytest.raises(InvalidArgument) as refused:
        validate_spec(spec_from_proto(message), datetime.now(UTC))
    assert {violation.field for violation in refused.value.violations} == {
        "spec.experiment.slurm",
        "spec.workspace.host",
        "spec.experiment.slurm.script_path",
        "spec.experiment.slurm.sbatch_args[0]",
        "spec.experiment.slurm.sbatch_args[1]",
        "spec.experiment.gpus.indices",
    }

    good = spec()
    good.workspace.host = "gpu1"
    good.experiment.ClearField("command_line")
    good.experiment.slurm.script_path = "jobs/train.sh"
    good.experiment.slurm.sbatch_args.append("--partition=gpu")
    kept = spec_to_proto(validate_spec(spec_from_proto(good), datetime.now(UTC)))
    assert kept.experiment.slurm == good.experiment.slurm and not kept.experiment.argv


class _LosesItsDatabaseOnce(WaitingLoops):
    """The first loop finds the database unreachable; the loops after it wait as usual."""

    def __init__(self) -> None:
        super().__init__()
        self.failed_once = False

    def __call__(self, handle: CampaignHandle) -> CampaignLoop:
        if not self.failed_once:
            self.failed_once = True
            return _Unreachable()
        return super().__call__(handle)


class _Unreachable:
    async def run(self) -> None:
        raise DatabaseUnavailable("the database is unavailable; retry", reason=ErrorReason.DATABASE_UNAVAILABLE)


async def test_a_campaign_whose_database_goes_away_is_resumed_not_failed(database: Database) -> None:
    loops = _LosesItsDatabaseOnce()
    campaigns = campaigns_on(database, loops, lease_seconds=1)
    await campaigns.start()
    try:
        record = await campaigns.start_campaign(spec_from_proto(spec()), "")
        resumed = await loops.next_started(within=15)  # the sweep takes it up once its lease lapses
        assert resumed.campaign_id == record.campaign_id
        current = await campaigns.get(record.campaign_id)
        assert current.state is not CampaignState.FAILED and current.phase is Phase.THINK
    finally:
        loops.release.set()
        await campaigns.close(end_within=1)
