"""THINK's tools on in-memory workers and thread: its delegations go through the run's delegation desk, so they
are recorded like a run's (assignment, route, usage) and bounded in parallel."""

from __future__ import annotations

import json
from pathlib import Path

from quarry.agent.conversation import ConversationStore, metadata
from quarry.agent.messages import ToolCall
from quarry.agent.model import ModelClient, ModelSettings
from quarry.db import Database
from quarry.identity import Principal, Role
from quarry.records.signals import MetricGoal, SignalRules, read_signals
from quarry.vocabulary import EntryKind, MetricDirection, Source
from supervisor_svc.campaigns.exports import insights_markdown
from supervisor_svc.campaigns.memory import think_briefing
from supervisor_svc.campaigns.think import THINK_TOOLS, Thinker, ThinkSession, ThinkSettings
from supervisor_svc.campaigns.thread import CampaignThread
from tests.fakes.openai_server import Call, Reply, ScriptedModel
from tests.supervisor_svc.campaigns.fakes import CAMPAIGN_ID, CONFIG, FakeDelegations, FakeScratchpad

ATTEMPT = f"{CAMPAIGN_ID}-c3-120000000000"


def session(
    delegations: FakeDelegations, scratchpad: FakeScratchpad, settings: ThinkSettings, attempt: str = ATTEMPT
) -> ThinkSession:
    """A THINK of cycle 3 (no model: the tests call its tools)."""
    thread = CampaignThread(scratchpad, CAMPAIGN_ID, CAMPAIGN_ID)
    thinker = Thinker(CAMPAIGN_ID, thread, scratchpad, None, None, delegations, settings)
    return thinker.session(3, attempt, "ws-fake")


def call(call_id: str, name: str, **arguments: object) -> ToolCall:
    return ToolCall(call_id, name, json.dumps(arguments))


async def test_the_engineers_delegation_edits_the_workspace_within_its_limits_and_is_recorded_like_a_runs() -> None:
    delegations, scratchpad = FakeDelegations(files=(CONFIG,)), FakeScratchpad()
    settings = ThinkSettings(engineer_turns=12, engineer_timeout_seconds=600.0)
    thinking = session(delegations, scratchpad, settings)

    (outcome,) = await THINK_TOOLS.run_calls([call("call-e", "delegate_engineer", change="Set lr to 0.1.")], thinking)

    assert not outcome.is_error and outcome.content.startswith(f"done; files changed: {CONFIG}")
    (order,) = delegations.orders
    assert (order.role, order.workspace_id, order.max_turns, order.timeout_seconds) == (
        Role.ENGINEER,
        "ws-fake",
        12,
        600.0,
    )
    assert order.delegation_id.startswith(ATTEMPT) and order.tool_call_id == "call-e"
    assert order.scratchpad_thread_id == CAMPAIGN_ID
    assert thinking.changes == ["Set lr to 0.1."] and thinking.files == {CONFIG}
    assert thinking.account.workers.tokens == 500  # counted in the cycle's tokens
    assert scratchpad.kinds(CAMPAIGN_ID) == [EntryKind.ASSIGNMENT, EntryKind.ROUTE, EntryKind.USAGE]


async def test_research_delegations_of_one_turn_run_within_the_parallel_bound_each_recorded() -> None:
    delegations, scratchpad = FakeDelegations(seconds=0.05, promoted=(7,)), FakeScratchpad()
    thinking = session(delegations, scratchpad, ThinkSettings(parallel_delegations=1))
    calls = [
        call(f"call-{n}", "delegate_research", objective=f"Question {n}?", criteria=["cite a source"]) for n in (1, 2)
    ]

    outcomes = await THINK_TOOLS.run_calls(calls, thinking)

    # The leader is told which entries were promoted, so an insight can cite them.
    promoted = "done; findings promoted: 1 (entries 7; record_insight cites the findings)"
    assert [o.content.splitlines()[0] for o in outcomes] == [promoted] * 2
    assert delegations.most_at_once == 1
    assert [(o.role, o.workspace_id, o.criteria) for o in delegations.orders] == [
        (Role.RESEARCHER, "", ("cite a source",))
    ] * 2
    assignments = [json.loads(e.content) for e in scratchpad.threads[CAMPAIGN_ID] if e.kind is EntryKind.ASSIGNMENT]
    assert sorted(a["objective"] for a in assignments) == ["Question 1?", "Question 2?"]
    assert scratchpad.kinds(CAMPAIGN_ID).count(EntryKind.USAGE) == 2
    assert thinking.files == set() and thinking.account.workers.tokens == 1000


async def test_a_think_redone_after_a_restart_delegates_under_new_ids() -> None:
    delegations, scratchpad = FakeDelegations(files=(CONFIG,)), FakeScratchpad()
    settings = ThinkSettings()
    first = session(delegations, scratchpad, settings)
    redone = session(delegations, scratchpad, settings, f"{CAMPAIGN_ID}-c3-130000000000")
    engineer = [call("call-e", "delegate_engineer", change="Set lr to 0.1.")]

    await THINK_TOOLS.run_calls(engineer, first)
    await THINK_TOOLS.run_calls(engineer, redone)

    ids = [order.delegation_id for order in delegations.orders]
    assert len(set(ids)) == 2
    assert scratchpad.kinds(CAMPAIGN_ID).count(EntryKind.ASSIGNMENT) == 2


async def test_a_think_stops_before_a_model_call_that_would_cross_what_the_cycle_may_spend(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """Each call costs 40 tokens and the cycle may spend 100: after two calls (80) a third would cross it, so
    THINK stops before asking, and says why (the ledger row's conclusion)."""
    database = Database(f"sqlite:///{tmp_path / 'think.db'}")
    metadata.create_all(database.engine)
    client = ModelClient(ModelSettings(base_url=model.base_url, model="scripted"))
    delegations, scratchpad = FakeDelegations(), FakeScratchpad()
    thread = CampaignThread(scratchpad, CAMPAIGN_ID, CAMPAIGN_ID)
    thinker = Thinker(
        CAMPAIGN_ID, thread, scratchpad, client, ConversationStore(database), delegations, ThinkSettings()
    )
    insights = (
        Reply(calls=(Call("record_insight", {"text": f"note {n}"}, f"i{n}"),), input_tokens=35, output_tokens=5)
        for n in range(3)
    )
    model.script(*insights, Reply(content="Raise the learning rate."))
    loss = MetricGoal("val_loss", MetricDirection.MINIMIZE)
    briefing = think_briefing("Lower val_loss.", [], read_signals([], loss, SignalRules()))
    try:
        thought = await thinker.think(3, ATTEMPT, briefing, "ws-fake", tokens_left=100)
    finally:
        await client.close()
        await database.close()

    assert thought.failure == (
        "stopped before a model call that would cross the campaign's token budget: 80 of the 100 tokens this "
        "cycle could spend are used, and a call costs about 40"
    )
    assert len(model.requests) == 2 and thought.tokens == 80


async def test_an_insight_cites_the_findings_its_cycles_research_promoted_and_only_those() -> None:
    scratchpad = FakeScratchpad()
    found = await scratchpad.append(
        CAMPAIGN_ID,
        kind=EntryKind.FINDING,
        author=Principal("researcher-1", Role.RESEARCHER),
        content="Warmup helps large learning rates.",
        sources=(Source("https://papers.example/warmup", "Warmup", "warmup stabilises training"),),
        request_id="finding-1",
    )
    finding = found.entry.sequence_no
    delegations = FakeDelegations(promoted=(finding,))
    thinking = session(delegations, scratchpad, ThinkSettings())

    refused = await THINK_TOOLS.run_calls(
        [call("call-0", "record_insight", text="Use warmup.", cites=[finding])], thinking
    )
    research = [call("call-1", "delegate_research", objective="Does warmup help?", criteria=[])]
    await THINK_TOOLS.run_calls(research, thinking)
    (outcome,) = await THINK_TOOLS.run_calls(
        [call("call-2", "record_insight", text="Use warmup with the larger rate.", cites=[finding])], thinking
    )

    # Before any research of its cycle promoted it, the finding cannot be cited.
    assert refused[0].is_error and "cite only findings this cycle's research promoted (none)" in refused[0].content
    assert not outcome.is_error and outcome.content == "recorded, citing 1 finding(s)"
    [insight] = [json.loads(e.content) for e in scratchpad.threads[CAMPAIGN_ID] if e.kind is EntryKind.CAMPAIGN_INSIGHT]
    assert insight["sources"] == [
        {"finding_ref": finding, "url": "https://papers.example/warmup", "excerpt": "warmup stabilises training"}
    ]
    # The exported journal shows where it rests.
    records = await CampaignThread(scratchpad, CAMPAIGN_ID, CAMPAIGN_ID).read()
    journal = insights_markdown(records)
    assert "Use warmup with the larger rate." in journal
    assert f'finding {finding}: https://papers.example/warmup, "warmup stabilises training"' in journal
