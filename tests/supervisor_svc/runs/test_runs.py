"""Research runs through the public API, on a mesh in this process."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from quarry.db import Database
from quarry.identity import Role
from quarry.records.research import Assignment, RouteDecision, TaskKind, UsageObserved
from quarry.v1 import common_pb2, scratchpad_pb2, supervisor_pb2, worker_pb2
from supervisor_svc.runs import events
from supervisor_svc.runs.domain import ResearchPhase, StartRequest
from supervisor_svc.runs.resumption import TAKEN_UP_NOTE
from supervisor_svc.runs.store import RunStore
from supervisor_svc.schema import runs
from tests.fakes.choreography import REPORT, SUPERVISOR
from tests.fakes.openai_server import Await, Call, DropAfter, Reply, Stall
from tests.supervisor_svc.conftest import Mesh, answer_at_once, delegation_on, researcher, wait_for_phase


async def test_a_run_delegates_and_reports_with_verified_citations(mesh: Mesh) -> None:
    researcher(mesh, "Find the height", "/article.html", "The tower is 330 m tall.", "The tower is 330 metres tall")
    mesh.script.add(
        SUPERVISOR,
        Reply(content="Delegating.", calls=(Call("delegate_research", {"objective": "Find the height"}, "d1"),)),
        Reply(calls=(Call("read_scratchpad", {}, "r1"),)),
        Reply(content="The height is known."),
    )
    mesh.script.add(REPORT, Reply(content="The tower is 330 metres tall [1]. It is blue [4].", chunks=6))
    run = await mesh.client.start_run("How tall is the Eiffel Tower?")
    events = await mesh.events(run.run_id)
    kinds = [event.WhichOneof("payload") for event in events]
    assert kinds[-1] == "completed", events[-1]
    assert [event.sequence_no for event in events] == list(range(1, len(events) + 1))
    completed = events[-1].completed
    assert completed.report.markdown == "The tower is 330 metres tall [1]. It is blue ."
    assert completed.removed_citations == 1
    [citation] = completed.report.citations
    assert citation.number == 1 and citation.url.endswith("/article.html")
    assert citation.excerpt == "The tower is 330 metres tall"
    assert "".join(e.content.delta for e in events if e.HasField("content")) == completed.report.markdown
    stored = await mesh.client.get_run(run.run_id)
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED
    assert stored.report == completed.report
    # The delegation's result carries what it promoted, re-read from the scratchpad, not the worker's transcript.
    delegation_result = mesh.script.requests[SUPERVISOR][1]["messages"][-1]["content"]
    assert "succeeded" in delegation_result and "Promoted entries, from the scratchpad:" in delegation_result
    assert "The tower is 330 m tall." in delegation_result and "The tower is 330 metres tall" in delegation_result
    assert "Champ de Mars" not in str(mesh.script.requests[SUPERVISOR])  # page text stays with the worker
    assert stored.last_sequence_no == events[-1].sequence_no
    assert list(completed.warnings) == [] and list(stored.warnings) == []  # it cites a verified source
    # The research ledger: the assignment, where it ran, what the researcher promoted, what it cost.
    entries = await mesh.scratchpad.read_all(stored.scratchpad_thread_id)
    assert [entry.sequence_no for entry in entries] == list(range(1, len(entries) + 1))
    assert [entry.kind for entry in entries] == [
        scratchpad_pb2.ENTRY_KIND_SEED,
        scratchpad_pb2.ENTRY_KIND_ASSIGNMENT,
        scratchpad_pb2.ENTRY_KIND_ROUTE,
        scratchpad_pb2.ENTRY_KIND_FINDING,
        scratchpad_pb2.ENTRY_KIND_USAGE,
    ]
    assignment = Assignment.parse(entries[1].content)
    assert isinstance(assignment, Assignment)
    assert (assignment.role, assignment.objective) == (Role.RESEARCHER, "Find the height")
    route = RouteDecision.parse(entries[2].content)
    assert isinstance(route, RouteDecision) and route.delegation_id == assignment.delegation_id
    serving = {e.status.worker_id for e in events if e.HasField("status") and e.status.worker_id}
    assert serving == {route.worker_id} and route.model == "scripted"
    usage = UsageObserved.parse(entries[4].content)
    assert isinstance(usage, UsageObserved) and usage.model_calls == 3  # the researcher's three scripted replies


async def test_a_run_whose_model_never_delegated_succeeds_and_says_its_report_has_no_sources(mesh: Mesh) -> None:
    answer_at_once(mesh, report="The tower is about 300 metres tall.")
    run = await mesh.client.start_run("How tall is the Eiffel Tower?")
    events = await mesh.events(run.run_id)
    completed = events[-1].completed
    assert completed.report.markdown == "The tower is about 300 metres tall."  # the text is still delivered
    [warning] = completed.warnings
    assert warning.code == supervisor_pb2.RUN_WARNING_CODE_NO_DELEGATIONS
    assert "never delegated" in warning.message
    stored = await mesh.client.get_run(run.run_id)
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED and not stored.HasField("error")
    assert list(stored.warnings) == list(completed.warnings)


@pytest.mark.parametrize("promoted", [False, True], ids=["nothing-promoted", "nothing-cited"])
async def test_a_run_whose_research_yields_no_cited_source_succeeds_with_a_no_sources_warning(
    mesh: Mesh, promoted: bool
) -> None:
    if promoted:  # a finding was verified and promoted, but the report cites nothing that stands
        researcher(mesh, "Find the height", "/article.html", "The tower is 330 m tall.", "The tower is 330 metres tall")
    else:
        mesh.script.add("Find the height", Reply(content="Found nothing worth promoting."))
    mesh.script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Find the height"}, "d1"),)),
        Reply(content="Write it up."),
    )
    mesh.script.add(REPORT, Reply(content="It is tall [7]."))
    run = await mesh.client.start_run("How tall is the Eiffel Tower?")
    events = await mesh.events(run.run_id)
    completed = events[-1].completed
    assert completed.report.markdown == "It is tall ." and list(completed.report.citations) == []
    [warning] = completed.warnings
    assert warning.code == supervisor_pb2.RUN_WARNING_CODE_NO_SOURCES
    assert "no verified finding was cited" in warning.message
    stored = await mesh.client.get_run(run.run_id)
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED and list(stored.warnings) == list(completed.warnings)


async def test_a_run_whose_model_server_reports_no_usage_says_its_tokens_are_estimates(mesh: Mesh) -> None:
    mesh.script.add(SUPERVISOR, Reply(content="No research needed.", usage=False))
    mesh.script.add(REPORT, Reply(content="The tower is about 300 metres tall."))
    run = await mesh.client.start_run("How tall is the Eiffel Tower?")
    completed = (await mesh.events(run.run_id))[-1].completed
    codes = [warning.code for warning in completed.warnings]
    assert codes == [supervisor_pb2.RUN_WARNING_CODE_NO_DELEGATIONS, supervisor_pb2.RUN_WARNING_CODE_USAGE_ESTIMATED]
    assert "no token usage" in completed.warnings[1].message
    stored = await mesh.client.get_run(run.run_id)
    assert list(stored.warnings) == list(completed.warnings)
    # The estimate is counted, never zero: the supervisor's prompt alone is hundreds of characters.
    assert stored.usage.supervisor.estimated_calls == 1 and stored.usage.supervisor.input_tokens > 50


async def test_a_warning_from_a_later_release_is_left_out_of_the_run_not_an_error(mesh: Mesh) -> None:
    answer_at_once(mesh)
    run = await mesh.client.start_run("Read back by an earlier release?")
    await mesh.events(run.run_id)
    database = Database(mesh.supervisor_database_url)
    try:
        later = runs.update().where(runs.c.run_id == run.run_id).values(warnings=["no_delegations", "from_later"])
        await database.write(lambda connection: connection.execute(later))
    finally:
        await database.close()
    stored = await mesh.client.get_run(run.run_id)
    assert [warning.code for warning in stored.warnings] == [supervisor_pb2.RUN_WARNING_CODE_NO_DELEGATIONS]


async def test_a_client_that_reattaches_misses_nothing_and_sees_nothing_twice(mesh: Mesh) -> None:
    researcher(mesh, "Find the height", "/article.html", "The tower is 330 m tall.", "The tower is 330 metres tall")
    mesh.script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Find the height"}, "d1"),)),
        Reply(content="Done.", delay=0.2),
    )
    mesh.script.add(REPORT, Reply(content="It is 330 metres tall [1]. " * 20, chunks=10, delay=0.2))
    run = await mesh.client.start_run("How tall is the Eiffel Tower?")
    seen: list[supervisor_pb2.RunEvent] = []
    attaches = 0
    while not seen or seen[-1].WhichOneof("payload") != "completed":
        attaches += 1
        assert attaches < 200
        after = seen[-1].sequence_no if seen else 0
        async for event in mesh.client.stream_run(run.run_id, after_sequence_no=after):
            seen.append(event)
            break  # disconnect after every event
    assert [e.sequence_no for e in seen] == list(range(1, len(seen) + 1))
    assert seen == await mesh.events(run.run_id)
    assert attaches == len(seen) > 5
    tail = await mesh.events(run.run_id, after=len(seen) - 2)
    assert [e.sequence_no for e in tail] == [len(seen) - 1, len(seen)]


async def test_parallel_delegations_in_one_turn_run_at_once(mesh: Mesh) -> None:
    # Each worker's model call is held until both have arrived: run one after the other, the first
    # would be held until the release's bound, and the check below would fail.
    both_arrived = asyncio.Event()
    for name in ("Task one", "Task two"):
        mesh.script.add(name, Await(both_arrived, Reply(content="waited")))

    async def release_when_both_arrived() -> bool:
        for _ in range(600):  # bounded: 30 s
            if all(mesh.script.arrivals.get(name) for name in ("Task one", "Task two")):
                both_arrived.set()
                return True
            await asyncio.sleep(0.05)
        both_arrived.set()
        return False

    release = asyncio.create_task(release_when_both_arrived())
    mesh.script.add(
        SUPERVISOR,
        Reply(
            calls=(
                Call("delegate_research", {"objective": "Task one"}, "a"),
                Call("delegate_research", {"objective": "Task two"}, "b"),
            )
        ),
        Reply(content="Both done."),
    )
    mesh.script.add(REPORT, Reply(content="Report."))
    run = await mesh.client.start_run("Two things at once?")
    events = await mesh.events(run.run_id)
    assert events[-1].WhichOneof("payload") == "completed"
    assert await release, "the second delegation's model call did not come while the first one's was held"
    phases = [e.status.phase for e in events if e.HasField("status")]
    delegated = [n for n, p in enumerate(phases) if p == supervisor_pb2.RESEARCH_PHASE_WORKER_DELEGATED]
    finished = [n for n, p in enumerate(phases) if p == supervisor_pb2.RESEARCH_PHASE_WORKER_COMPLETED]
    assert len(delegated) == 2 and len(finished) == 2 and max(delegated) < min(finished)
    tool_results = mesh.script.tool_results(SUPERVISOR)
    assert len(tool_results) == 2 and all("succeeded" in result for result in tool_results)


async def test_status_events_name_the_worker_serving_each_delegation(mesh: Mesh) -> None:
    for name in ("Task one", "Task two"):
        mesh.script.add(name, Reply(content="done"))
    calls = (
        Call("delegate_research", {"objective": "Task one"}, "a"),
        Call("delegate_research", {"objective": "Task two"}, "b"),
    )
    mesh.script.add(SUPERVISOR, Reply(calls=calls), Reply(content="Both done."))
    mesh.script.add(REPORT, Reply(content="Report."))
    run = await mesh.client.start_run("Who did what?")
    events = await mesh.events(run.run_id)
    assert events[-1].WhichOneof("payload") == "completed"
    named: dict[str, set[str]] = {}
    for status in (e.status for e in events if e.HasField("status") and e.status.delegation_id):
        if status.phase != supervisor_pb2.RESEARCH_PHASE_WORKER_DELEGATED:  # no worker has it yet
            named.setdefault(status.delegation_id, set()).add(status.worker_id)
    assert len(named) == 2
    for delegation_id, worker_ids in named.items():
        [recorded] = [d for a in mesh.worker_addresses if (d := await delegation_on(a, delegation_id)) is not None]
        assert worker_ids == {recorded.worker_id} and recorded.worker_id
    assert len({recorded_id for ids in named.values() for recorded_id in ids}) == 2, "round-robin: two workers"


async def test_cancel_run_stops_its_workers_and_ends_the_run_cancelled(mesh: Mesh) -> None:
    mesh.script.add("Research slowly", Stall(60))
    mesh.script.add(SUPERVISOR, Reply(calls=(Call("delegate_research", {"objective": "Research slowly"}, "d1"),)))
    run = await mesh.client.start_run("Slow question?")
    await wait_for_phase(mesh, run.run_id, supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING)
    cancelled = await mesh.client.cancel_run(run.run_id, reason="user pressed Ctrl-C")
    assert cancelled.state == supervisor_pb2.RUN_STATE_CANCELLED
    assert cancelled.cancel_reason == "user pressed Ctrl-C" and not cancelled.HasField("error")
    events = await mesh.events(run.run_id)
    assert events[-1].cancelled.reason == "user pressed Ctrl-C"
    delegation_id = next(e.status.delegation_id for e in events if e.status.delegation_id)
    recorded = None
    for _ in range(100):  # the worker records the cancellation as its task unwinds
        [recorded] = [d for a in mesh.worker_addresses if (d := await delegation_on(a, delegation_id)) is not None]
        if recorded.state != worker_pb2.DELEGATION_STATE_RUNNING:
            break
        await asyncio.sleep(0.05)
    assert recorded is not None and recorded.state == worker_pb2.DELEGATION_STATE_FAILED
    assert recorded.result.error.code == common_pb2.DELEGATION_ERROR_CODE_CANCELLED
    again = await mesh.client.cancel_run(run.run_id)  # cancelling an ended run changes nothing
    assert again.state == supervisor_pb2.RUN_STATE_CANCELLED and again.cancel_reason == "user pressed Ctrl-C"


async def test_the_token_budget_stops_further_delegation(mesh: Mesh) -> None:
    mesh.script.add("Spend tokens", Reply(content="spent", input_tokens=400, output_tokens=100))
    mesh.script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Spend tokens"}, "d1"),)),
        Reply(calls=(Call("delegate_research", {"objective": "Never runs"}, "d2"),)),
    )
    mesh.script.add(REPORT, Reply(content="From what exists."))
    run = await mesh.client.start_run("Budgeted?", options=supervisor_pb2.RunOptions(max_tokens=300))
    events = await mesh.events(run.run_id)
    completed = events[-1].completed
    assert completed.token_budget_exhausted and not completed.turn_budget_exhausted
    assert completed.report.markdown == "From what exists."
    delegated = [e for e in events if e.status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_DELEGATED]
    assert len(delegated) == 1
    assert len(mesh.script.requests[SUPERVISOR]) == 1  # no turn after the budget was spent
    assert "Never runs" not in mesh.script.requests
    assert completed.usage.workers.input_tokens == 400 and completed.usage.workers.output_tokens == 100
    assert completed.usage.total.input_tokens == completed.usage.supervisor.input_tokens + 400


async def test_the_turn_bound_ends_research_and_the_report_says_so(mesh: Mesh) -> None:
    mesh.script.add(SUPERVISOR, *(Reply(calls=(Call("read_scratchpad", {}, f"r{n}"),)) for n in range(2)))
    mesh.script.add(REPORT, Reply(content="Partial picture."))
    run = await mesh.client.start_run("Endless?", options=supervisor_pb2.RunOptions(max_supervisor_turns=2))
    events = await mesh.events(run.run_id)
    assert events[-1].completed.turn_budget_exhausted
    assert events[-1].completed.usage.supervisor.model_calls == 3  # two research turns and the report


async def test_a_provider_failure_fails_the_run_honestly(mesh: Mesh) -> None:
    mesh.script.add(SUPERVISOR, Reply(content="Nothing to do."))
    mesh.script.add(REPORT, DropAfter("The tower is"))
    run = await mesh.client.start_run("Will the report break?")
    events = await mesh.events(run.run_id)
    failed = events[-1].failed
    assert failed.error.code == supervisor_pb2.RUN_ERROR_CODE_PROVIDER_ERROR
    stored = await mesh.client.get_run(run.run_id)
    assert stored.state == supervisor_pb2.RUN_STATE_FAILED and not stored.HasField("report")
    assert "model request failed" in stored.error.message
    assert stored.HasField("end_time") and stored.HasField("start_time")


async def test_a_run_whose_supervisor_stopped_before_it_began_is_taken_up_when_its_lease_expires(mesh: Mesh) -> None:
    mesh.script.add(SUPERVISOR, Reply(content="Nothing to research."))
    mesh.script.add(REPORT, Reply(content="Nothing was found."))
    database = Database(mesh.supervisor_database_url)
    store = RunStore(database)
    try:
        orphan, _ = await store.create(
            "run-" + "a" * 32, StartRequest("Left behind?"), scratchpad_thread_id="run-" + "a" * 32, owner="gone"
        )
        stale = (
            runs.update()
            .where(runs.c.run_id == orphan.run_id)
            .values(heartbeat_time=datetime.now(UTC) - timedelta(hours=1))
        )
        await database.write(lambda connection: connection.execute(stale))
    finally:
        await database.close()
    events = await asyncio.wait_for(mesh.events(orphan.run_id), 30)  # the sweep runs every 2 s
    assert events[0].status.phase == supervisor_pb2.RESEARCH_PHASE_STARTED
    assert events[-1].WhichOneof("payload") == "completed", events[-1].failed.error.message
    assert (await mesh.client.get_run(orphan.run_id)).state == supervisor_pb2.RUN_STATE_SUCCEEDED


async def test_a_run_taken_up_too_often_is_failed_not_taken_up_again(mesh: Mesh) -> None:
    database = Database(mesh.supervisor_database_url)
    store = RunStore(database)
    run_id = "run-" + "b" * 32
    try:
        await store.create(run_id, StartRequest("Crashes every supervisor?"), scratchpad_thread_id=run_id, owner="gone")
        await store.mark_running(run_id, events.status(ResearchPhase.STARTED, "research started"))
        for _ in range(5):  # five processes took it up, and each stopped before it ended
            await store.append(run_id, [events.status(ResearchPhase.STARTED, f"{TAKEN_UP_NOTE}; 0 delegation(s)")])
        stale = (
            runs.update().where(runs.c.run_id == run_id).values(heartbeat_time=datetime.now(UTC) - timedelta(hours=1))
        )
        await database.write(lambda connection: connection.execute(stale))
    finally:
        await database.close()
    ended = (await asyncio.wait_for(mesh.events(run_id), 30))[-1]  # the sweep runs every 2 s
    assert ended.failed.error.code == supervisor_pb2.RUN_ERROR_CODE_INTERNAL
    assert "taken up 5 times" in ended.failed.error.message
    assert not mesh.script.requests, "no model was asked"


async def test_a_supervisor_shutting_down_leaves_its_runs_active_for_the_next_one(mesh: Mesh) -> None:
    mesh.script.add("Research slowly", Stall(60))
    mesh.script.add(SUPERVISOR, Reply(calls=(Call("delegate_research", {"objective": "Research slowly"}, "d1"),)))
    run = await mesh.client.start_run("Interrupted?")
    await wait_for_phase(mesh, run.run_id, supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING)
    await mesh.supervisor.shutdown()
    database = Database(mesh.supervisor_database_url)
    try:
        store = RunStore(database)
        record = await store.get(run.run_id)
        stored = await store.events_after(run.run_id, 0)
        released = await store.expired(datetime.now(UTC) - timedelta(days=1))
    finally:
        await database.close()
    assert record is not None and record.state.value == "running" and record.end_time is None
    assert not any(event.terminal for event in stored)
    assert [event.sequence_no for event in stored] == list(range(1, len(stored) + 1))
    assert released == [run.run_id], "its lease is given up, for the next sweep to take it up at once"
    # The worker recorded its delegation as interrupted, so the same Delegate goes on with it.
    [delegation_id] = {
        event.status.delegation_id
        for event in map(supervisor_pb2.RunEvent.FromString, (stored_event.payload for stored_event in stored))
        if event.status.delegation_id
    }
    records = [await delegation_on(worker.address, delegation_id) for worker in mesh.workers]
    [delegation] = [found for found in records if found is not None]
    assert delegation.result.error.code == common_pb2.DELEGATION_ERROR_CODE_CANCELLED


async def test_the_model_may_delegate_a_scout_and_an_extractor_and_the_ledger_names_each_task_kind(mesh: Mesh) -> None:
    """Literature roles the supervisor's model may order: a scout lists candidate sources from its searches, an
    extractor records claims from the one source it is given. Their records are on the ledger, not findings: the
    report cites only what researchers promote."""
    article = f"{mesh.site.base_url}/article.html"
    candidate = {"url": article, "title": "article.html", "why": "it gives the tower's height"}
    mesh.script.add(
        "Screen the sources",
        Reply(calls=(Call("perform_web_search", {"query": "eiffel tower"}, "search"),)),
        Reply(calls=(Call("submit_candidate_sources", {"candidates": [candidate]}, "submit"),)),
    )
    extract = {
        "kind": "claim",
        "statement": "It is 330 m tall.",
        "quote": "330 metres tall",
        "location": "2nd paragraph",
    }
    mesh.script.add(
        "Extract the height",
        Reply(calls=(Call("read_web_page", {"url": article}, "read"),)),
        Reply(calls=(Call("submit_extracted_evidence", {"source_url": article, "records": [extract]}, "submit"),)),
    )
    scout = {"objective": "Screen the sources", "role": "scout"}
    extractor = {"objective": "Extract the height", "role": "extractor", "input_refs": [article]}
    mesh.script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", scout, "d1"),)),
        Reply(calls=(Call("delegate_research", {**extractor, "input_refs": []}, "bad"),)),  # no source: refused
        Reply(calls=(Call("delegate_research", extractor, "d2"),)),
        Reply(content="Enough."),
    )
    mesh.script.add(REPORT, Reply(content="Nothing was promoted."))
    run = await mesh.client.start_run("How tall is the Eiffel Tower?")
    events = await mesh.events(run.run_id)
    assert events[-1].HasField("completed"), events[-1]
    refused = mesh.script.requests[SUPERVISOR][2]["messages"][-1]["content"]
    assert "an extractor's input_refs name the one source URL it reads" in refused

    entries = await mesh.scratchpad.read_all(run.scratchpad_thread_id)
    assignments = [Assignment.parse(e.content) for e in entries if e.kind == scratchpad_pb2.ENTRY_KIND_ASSIGNMENT]
    assert [(a.role, a.task_kind) for a in assignments if isinstance(a, Assignment)] == [
        (Role.SCOUT, TaskKind.LITERATURE_SCREENING),
        (Role.EXTRACTOR, TaskKind.EVIDENCE_EXTRACTION),
    ]
    kinds = {e.kind: e for e in entries}
    assert kinds[scratchpad_pb2.ENTRY_KIND_CANDIDATES].author.role == common_pb2.ROLE_SCOUT
    assert kinds[scratchpad_pb2.ENTRY_KIND_EVIDENCE].author.role == common_pb2.ROLE_EXTRACTOR
    assert scratchpad_pb2.ENTRY_KIND_FINDING not in kinds
    # What the supervisor's model read back: each delegation's record, re-read from the scratchpad.
    told = mesh.script.requests[SUPERVISOR][1]["messages"][-1]["content"]
    assert "candidate_sources" in told and "it gives the tower's height" in told
    # Neither is the review's: their tokens are the workers', not verification's.
    assert events[-1].completed.usage.verification.model_calls == 0
