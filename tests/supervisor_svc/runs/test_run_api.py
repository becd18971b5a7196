"""The public API's bookkeeping of runs, on a mesh in this process: listing and its page tokens, idempotent
starts, bad requests, and re-attaching at the end of a run's events."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from quarry import paging
from quarry.v1 import common_pb2, scratchpad_pb2, supervisor_pb2
from tests.fakes.choreography import SUPERVISOR
from tests.fakes.openai_server import Call, Reply, Stall
from tests.rpc import error_reason, expect_error, violations
from tests.supervisor_svc.conftest import Mesh, answer_at_once, wait_for_phase


async def test_runs_are_listed_newest_first_in_pages(mesh: Mesh) -> None:
    ids = []
    for n in range(3):
        answer_at_once(mesh)
        run = await mesh.client.start_run(f"Question {n}?", labels={"batch": "b1"})
        await mesh.events(run.run_id)
        ids.append(run.run_id)
    first = await mesh.client.list_runs(page_size=2)
    second = await mesh.client.list_runs(page_size=2, page_token=first.next_page_token)
    assert [r.run_id for r in first.runs] + [r.run_id for r in second.runs] == ids[::-1]
    assert not second.next_page_token and first.runs[0].labels == {"batch": "b1"}
    failed = await mesh.client.list_runs(state=supervisor_pb2.RUN_STATE_FAILED)
    assert list(failed.runs) == []
    error = await expect_error(
        mesh.client.list_runs(page_token=first.next_page_token, state=supervisor_pb2.RUN_STATE_FAILED),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "page_token" in violations(error)


RUN = "run-" + "b" * 32
# Cursors that decode but that no ListRuns ever issued: each must be refused as INVALID_ARGUMENT.
FORGED_CURSORS = [
    f"v1||2024-01-01T00:00:00|{RUN}",  # a naive timestamp
    f"v1||9999-12-31T23:59:59-23:59|{RUN}",  # beyond the last representable instant once in UTC
    f"v1||0001-01-01T00:00:00+23:59|{RUN}",  # before the first
    f"v1||2024-01-01T00:00:00+02:00|{RUN}",  # an offset this server never writes
    f"v1||2024-01-01 00:00:00+00:00|{RUN}",  # not the form this server writes
    "v1||2024-01-01T00:00:00+00:00|run-\x00",  # NUL in the run id
    "v1||2024-01-01T00:00:00\x00+00:00|" + RUN,  # NUL in the timestamp
    "v1||2024-01-01T00:00:00+00:00|not-a-run",
    f"v1|\x00|2024-01-01T00:00:00+00:00|{RUN}",
    f"v2||2024-01-01T00:00:00+00:00|{RUN}",
    f"v1||2024-01-01T00:00:00+00:00|{RUN}|extra",
    "v1||",
    "",
]


@pytest.mark.parametrize("cursor", FORGED_CURSORS)
async def test_list_runs_refuses_a_page_token_it_never_issued(mesh: Mesh, cursor: str) -> None:
    error = await expect_error(
        mesh.client.list_runs(page_token=paging.encode_token(cursor) or "="), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "page_token" in violations(error)


async def test_list_runs_refuses_a_token_in_another_encoding(mesh: Mesh) -> None:
    for n in range(2):
        answer_at_once(mesh)
        await mesh.events((await mesh.client.start_run(f"Question {n}?")).run_id)
    token = (await mesh.client.list_runs(page_size=1)).next_page_token
    assert len((await mesh.client.list_runs(page_token=token)).runs) == 1
    # The same cursor, written with padding or with characters base64 decoding would skip.
    for variant in [token + "=" * (-len(token) % 4 or 4), token[:4] + "!" + token[4:], token + "\n"]:
        error = await expect_error(mesh.client.list_runs(page_token=variant), grpc.StatusCode.INVALID_ARGUMENT)
        assert "page_token" in violations(error)
    # Positions at either end of time are still positions: everything is older than the last, nothing than the first.
    latest = paging.encode_token(f"v1||9999-12-31T23:59:59.999999+00:00|{RUN}")
    assert len((await mesh.client.list_runs(page_token=latest)).runs) == 2
    earliest = paging.encode_token(f"v1||0001-01-01T00:00:00+00:00|{RUN}")
    assert list((await mesh.client.list_runs(page_token=earliest)).runs) == []


async def test_start_run_is_idempotent_by_request_id(mesh: Mesh) -> None:
    answer_at_once(mesh)
    first = await mesh.client.start_run("Once?", request_id="req-1")
    again = await mesh.client.start_run("Once?", request_id="req-1")
    assert again.run_id == first.run_id
    error = await expect_error(mesh.client.start_run("Other?", request_id="req-1"), grpc.StatusCode.ALREADY_EXISTS)
    assert error_reason(error) == "REQUEST_ID_REUSED"
    await mesh.events(first.run_id)
    assert len((await mesh.client.list_runs()).runs) == 1


@pytest.mark.parametrize("supervisor_overrides", [{"max_active_runs": 2}], indirect=True)
async def test_concurrent_retries_of_one_start_run_share_one_run_and_one_slot(mesh: Mesh) -> None:
    mesh.script.add(SUPERVISOR, Stall(60), Stall(60))  # both runs stay active, holding their slots
    calls = [mesh.client.start_run("Once, however often asked?", request_id="req-many") for _ in range(20)]
    started = await asyncio.gather(*calls, return_exceptions=True)
    refused = [result for result in started if isinstance(result, BaseException)]
    assert refused == [], [str(error) for error in refused]
    assert len({run.run_id for run in started if isinstance(run, supervisor_pb2.Run)}) == 1
    assert len((await mesh.client.list_runs()).runs) == 1
    # The retries took one slot between them: another request still fits, and then the supervisor is full.
    other = await mesh.client.start_run("Another question?", request_id="req-other")
    assert other.run_id not in {run.run_id for run in started if isinstance(run, supervisor_pb2.Run)}
    error = await expect_error(mesh.client.start_run("One too many?"), grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert error_reason(error) == "TOO_MANY_RUNS"
    # A retry of a request that already has its run gets it back even now, and a conflicting one is refused.
    assert (await mesh.client.start_run("Another question?", request_id="req-other")).run_id == other.run_id
    error = await expect_error(
        mesh.client.start_run("Something else?", request_id="req-many"), grpc.StatusCode.ALREADY_EXISTS
    )
    assert error_reason(error) == "REQUEST_ID_REUSED"


async def test_concurrent_start_runs_with_one_request_id_but_different_questions(mesh: Mesh) -> None:
    mesh.script.add(SUPERVISOR, Stall(60))
    calls = [mesh.client.start_run(f"Question {n % 2}?", request_id="req-split") for n in range(10)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    runs = [result for result in results if isinstance(result, supervisor_pb2.Run)]
    refused = [result for result in results if not isinstance(result, supervisor_pb2.Run)]
    # One question won the request_id; every call asking it got its run, every call asking the other was refused.
    assert len({run.run_id for run in runs}) == 1 and len(runs) == 5
    assert all(
        isinstance(error, grpc.aio.AioRpcError) and error_reason(error) == "REQUEST_ID_REUSED" for error in refused
    )
    assert len((await mesh.client.list_runs()).runs) == 1


async def test_bad_requests_name_their_fields(mesh: Mesh) -> None:
    options = supervisor_pb2.RunOptions(max_supervisor_turns=-1, max_worker_turns=65, max_parallel_delegations=99)
    options.timeout.FromSeconds(10**9)
    options.role_routes.extend(
        [
            supervisor_pb2.RoleRoute(role=common_pb2.ROLE_SUPERVISOR, tier=common_pb2.MODEL_TIER_WORKER),
            supervisor_pb2.RoleRoute(role=common_pb2.ROLE_VERIFIER, tier=common_pb2.MODEL_TIER_SUPERVISOR),
            supervisor_pb2.RoleRoute(role=common_pb2.ROLE_VERIFIER, tier=common_pb2.MODEL_TIER_WORKER),
            supervisor_pb2.RoleRoute(role=common_pb2.ROLE_ADJUDICATOR),
        ]
    )
    error = await expect_error(
        mesh.client.start_run(" ", options=options, labels={"Bad Key": "x"}), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert set(violations(error)) == {
        "question",
        "options.max_supervisor_turns",
        "options.max_worker_turns",
        "options.max_parallel_delegations",
        "options.timeout",
        "options.role_routes[0].role",  # the supervisor is not delegated
        "options.role_routes[2].role",  # a role routed twice
        "options.role_routes[3].tier",  # no tier
        "labels['Bad Key']",
    }
    error = await expect_error(mesh.client.get_run("nope"), grpc.StatusCode.INVALID_ARGUMENT)
    assert "run_id" in violations(error)
    await expect_error(mesh.client.get_run("run-" + "0" * 32), grpc.StatusCode.NOT_FOUND)
    await expect_error(mesh.client.cancel_run("run-" + "0" * 32), grpc.StatusCode.NOT_FOUND)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await mesh.events("run-" + "0" * 32)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    answer_at_once(mesh)
    run = await mesh.client.start_run("Fine?")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await mesh.events(run.run_id, after=-1)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await mesh.events(run.run_id)


async def test_a_cancel_reason_with_a_nul_is_refused_and_the_run_goes_on(mesh: Mesh) -> None:
    mesh.script.add("Research slowly", Stall(60))
    mesh.script.add(SUPERVISOR, Reply(calls=(Call("delegate_research", {"objective": "Research slowly"}, "d1"),)))
    run = await mesh.client.start_run("Slow question?")
    await wait_for_phase(mesh, run.run_id, supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING)
    error = await expect_error(
        mesh.client.cancel_run(run.run_id, reason="stop\x00now"), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "reason" in violations(error)
    assert (await mesh.client.get_run(run.run_id)).state == supervisor_pb2.RUN_STATE_RUNNING
    cancelled = await mesh.client.cancel_run(run.run_id, reason="stop now")
    assert cancelled.state == supervisor_pb2.RUN_STATE_CANCELLED and cancelled.cancel_reason == "stop now"


async def test_reattaching_at_or_past_the_end(mesh: Mesh) -> None:
    answer_at_once(mesh)
    run = await mesh.client.start_run("Short?")
    events = await mesh.events(run.run_id)
    last = events[-1].sequence_no
    assert await mesh.events(run.run_id, after=last) == []  # nothing more, and the stream ends
    error = await expect_error(mesh.events(run.run_id, after=last + 1), grpc.StatusCode.INVALID_ARGUMENT)
    assert "after_sequence_no" in violations(error)


async def test_list_runs_refuses_an_unknown_state(mesh: Mesh) -> None:
    error = await expect_error(mesh.client.list_runs(state=99), grpc.StatusCode.INVALID_ARGUMENT)  # type: ignore[arg-type]
    assert "state" in violations(error)


async def test_a_runs_ledger_is_read_in_pages_that_go_on_where_the_last_one_ended(mesh: Mesh) -> None:
    mesh.script.add("Look it up", Reply(content="Found nothing."))
    mesh.script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Look it up"}, "d1"),)),
        Reply(content="Write it up."),
    )
    run = await mesh.client.start_run("What is the question?")
    await mesh.events(run.run_id)
    whole = await mesh.client.read_ledger(run.run_id)
    # The seed, then the delegation's assignment, route and usage: the thread as the scratchpad holds it.
    assert [e.sequence_no for e in whole] == list(range(1, len(whole) + 1)) and len(whole) >= 4
    assert whole[0].kind == scratchpad_pb2.ENTRY_KIND_SEED
    assert scratchpad_pb2.ENTRY_KIND_ASSIGNMENT in {e.kind for e in whole}
    paged, token = [], ""
    for _ in range(len(whole)):
        page = await mesh.client.list_run_ledger(run.run_id, page_size=1, page_token=token)
        paged.extend(page.entries)
        token = page.next_page_token
        if not token:
            break
    assert paged == whole and not token  # the last page says there is no more
    # A token names its run and its place; another run's, a forged one and a missing run are refused.
    other = await mesh.client.start_run("Another question?", request_id="other")
    first = await mesh.client.list_run_ledger(run.run_id, page_size=1)
    for token in (first.next_page_token, paging.encode_token(f"{other.run_id}:x")):
        error = await expect_error(
            mesh.client.list_run_ledger(other.run_id, page_token=token), grpc.StatusCode.INVALID_ARGUMENT
        )
        assert "page_token" in violations(error)
    await expect_error(mesh.client.list_run_ledger("run-" + "0" * 32), grpc.StatusCode.NOT_FOUND)
    await mesh.events(other.run_id)
