"""Research-run benchmark: the supervisor's context, parallel delegations, and the delegate hop.

    python3 bench/run.py [--page-kb 200] [--latency 0.3] [--hops 30] [--verification 1] [--rounds 5]

Starts the scratchpad, two workers and the supervisor as `quarry serve`
processes (SQLite); the scripted OpenAI-compatible model and the fixture web
run in this process. The model reports prompt tokens as the request's
characters / 4, so token figures scale with what each agent really sends.
  1. Context: one run of 4 parallel delegations whose workers each read three
     4,000-character chunks of a large page and promote one finding. Prints the
     supervisor's largest prompt (research turns and the report call) against
     all tokens the run used (goal <= 10%).
  2. Parallelism: the wall time of the delegation phase with k = 4 parallel
     delegations against one delegation alone, with `latency` seconds per model
     turn (goal <= 1.2x).
  3. Delegate hop: sequential single delegations; from the last byte of the
     supervisor's model reply that asks for a delegation to the arrival of the
     worker's first model request (goal p50 <= 1 ms, p99 <= 5 ms). This span
     covers the supervisor parsing the reply, recording the "delegated" event,
     the Delegate RPC, and the worker recording the delegation and its
     conversation before calling the model.
  4. Verification cost (unless --verification 0): the same scripted research
     (one researcher, four findings, a four-sentence draft; tests/fakes/evidence.py)
     with verification off and on, in an order alternating by round,
     `latency` seconds per model call: model calls, tokens, the evidence roles'
     tokens, wall time and the on/off ratios, and what the verification settled; then verification on
     again with a token budget of 2.5x the unverified run's (half of it the review's reserve): what it
     used of the budget, and what it left unverified or unaudited (and said so).
All four run once per round (bench/rounds.py); ratios are taken within a round.
Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import arguments, percentile
from rounds import MIN_ROUNDS, Rounds

from quarry.clients.runs import RunsClient
from quarry.v1 import supervisor_pb2
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography, agent_of, append_finding
from tests.fakes.evidence import QUESTION, EvidenceScript, add_pages, tower_scenario
from tests.fakes.openai_server import Call, Reply, ScriptedModel, Step
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.conftest import processes

WORDS = "The lattice tower of wrought iron stands on the Champ de Mars in Paris and draws crowds every day. "


# The review's roles, by the first line of their tasks (tests/fakes/evidence.py answers them by it).
REVIEW_AGENTS = {
    "claim verifiers": "Verify finding ",
    "citation auditors": "Audit sentence ",
    "adjudicators": "Adjudicate objection ",
    "reviser": "Revise sentence ",
}


def large_page(title: str, kilobytes: int) -> str:
    body = "".join(f"<p>{WORDS * 4} Paragraph {n} of {title}.</p>\n" for n in range(kilobytes * 1024 // 420))
    return f"<!doctype html><html><head><title>{title}</title></head><body><article>{body}</article></body></html>"


def counting(choreography: Choreography, latency: float = 0.0) -> Any:
    """The choreography's steps, with usage as a real model would report it (about 4 characters a token),
    each reply taking `latency` seconds unless its script says otherwise."""

    def answer(body: dict[str, Any]) -> Step:
        step = choreography(body)
        if not isinstance(step, Reply):
            return step
        sent = len(json.dumps(body["messages"])) // 4
        produced = (len(step.content) + sum(len(json.dumps(call.arguments)) for call in step.calls)) // 4
        return dataclasses.replace(step, input_tokens=sent, output_tokens=max(produced, 1), delay=step.delay or latency)

    return answer


def researcher(choreography: Choreography, objective: str, url: str, latency: float) -> None:
    choreography.add(
        objective,
        Reply(calls=(Call("read_web_page", {"url": url}, "read"),), delay=latency),
        Reply(calls=(Call("scroll_web_page", {"url": url, "page": 2}, "scroll-2"),), delay=latency),
        Reply(calls=(Call("scroll_web_page", {"url": url, "page": 3}, "scroll-3"),), delay=latency),
        Reply(
            calls=(
                append_finding(
                    "promote",
                    f"{objective}: the tower stands on the Champ de Mars.",
                    url,
                    "stands on the Champ de Mars in Paris",
                ),
            ),
            delay=latency,
        ),
        Reply(content="Promoted one finding.", delay=latency),
    )


async def run_once(
    client: RunsClient,
    question: str,
    verification: supervisor_pb2.VerificationMode.ValueType = supervisor_pb2.VERIFICATION_MODE_OFF,
    max_tokens: int = 0,
) -> list[supervisor_pb2.RunEvent]:
    options = supervisor_pb2.RunOptions(max_supervisor_turns=64, verification=verification, max_tokens=max_tokens)
    run = await client.start_run(question, options=options)
    events = [event async for event in client.stream_run(run.run_id)]
    assert events[-1].HasField("completed"), events[-1]
    return events


def fan_out(choreography: Choreography, objectives: list[str], urls: list[str], latency: float) -> None:
    for objective, url in zip(objectives, urls, strict=True):
        researcher(choreography, objective, url, latency)
    calls = tuple(Call("delegate_research", {"objective": o}, f"d{n}") for n, o in enumerate(objectives))
    choreography.add(
        SUPERVISOR,
        Reply(content="Four angles at once.", calls=calls),
        Reply(calls=(Call("read_scratchpad", {}, "check"),)),
        Reply(content="Enough."),
    )
    choreography.add(REPORT, Reply(content="The tower stands on the Champ de Mars [1]. " * 8))


async def main_async(args: argparse.Namespace) -> None:
    rounds = Rounds("run", args.rounds)
    async with ScriptedModel() as model, FixtureWeb() as site:
        urls = [site.add(f"/large-{n}.html", large_page(f"Page {n}", args.page_kb)) for n in range(4)]
        add_pages(site)
        with tempfile.TemporaryDirectory() as workdir, processes(Path(workdir), model, site) as mesh:
            async with RunsClient.connect(mesh.supervisor.address) as client:
                for index in rounds:
                    await context_share(rounds, model, client, urls)
                    await parallel_ratio(rounds, model, client, urls, args.latency, index)
                    values = await delegate_hop(model, client, args.hops)
                    rounds.record("delegate hop p50", percentile(values, 0.5), "ms")
                    rounds.record("delegate hop p99", percentile(values, 0.99), "ms")
                    if args.verification:
                        await verification_cost(rounds, model, site, client, args.latency, index)
    rounds.ratio("delegate hop p99 / p50", "delegate hop p99", "delegate hop p50")
    rounds.ratio("parallel k=4 / k=1", "delegation phase, k=4", "delegation phase, k=1")
    rounds.ratio("verification wall on / off", "wall, verification on", "wall, verification off")
    rounds.ratio("verification tokens on / off", "tokens, verification on", "tokens, verification off")
    print(
        f"goals: supervisor's largest prompt <= 10% of the run's tokens; k=4 parallel delegations <= 1.2x one alone "
        f"({args.latency * 1000:.0f} ms a model turn); delegate hop ({args.hops} sequential) p99 <= 3x p50"
    )
    rounds.report()


async def context_share(rounds: Rounds, model: ScriptedModel, client: RunsClient, urls: list[str]) -> None:
    choreography = Choreography()
    model.default = counting(choreography)
    model.exchanges.clear()
    objectives = [f"Angle {n}" for n in range(4)]
    fan_out(choreography, objectives, urls, 0.0)
    events = await run_once(client, "Where does the tower stand?")
    usage = events[-1].completed.usage
    prompts = [
        len(json.dumps(body["messages"])) // 4
        for _, _, body in model.exchanges
        if agent_of(body) in (SUPERVISOR, REPORT)
    ]
    total = usage.total.input_tokens + usage.total.output_tokens
    largest = max(prompts)
    rounds.record("supervisor's largest prompt / run tokens", 100 * largest / total, "%")
    rounds.record("run tokens (context run)", total, "tokens")


async def parallel_ratio(
    rounds: Rounds, model: ScriptedModel, client: RunsClient, urls: list[str], latency: float, index: int
) -> None:
    phases = {}
    for k in (1, 4):
        choreography = Choreography()
        model.default = counting(choreography)
        objectives = [f"Parallel {index}-{k}-{n}" for n in range(k)]
        # URLs no worker has read yet (the query makes them new to the page cache): both runs extract pages.
        fan_out(choreography, objectives, [f"{url}?run={index}-{k}" for url in urls[:k]], latency)
        await run_once(client, f"{k} at once?")
        first, second = choreography.arrivals[SUPERVISOR][:2]
        phases[k] = second - first
    for k, seconds in phases.items():
        rounds.record(f"delegation phase, k={k}", seconds, "s")


async def delegate_hop(model: ScriptedModel, client: RunsClient, hops: int) -> list[float]:
    """Milliseconds from each delegating reply's last byte to the worker's first model request."""
    choreography = Choreography()
    model.default = choreography
    for n in range(hops):
        choreography.add(f"Hop {n}", Reply(content="done"))
        choreography.add(SUPERVISOR, Reply(calls=(Call("delegate_research", {"objective": f"Hop {n}"}, f"h{n}"),)))
    choreography.add(SUPERVISOR, Reply(content="Enough."))
    choreography.add(REPORT, Reply(content="Report."))
    model.exchanges.clear()
    await run_once(client, "How fast is a hop?")
    supervisor_ends = [end for _, end, body in model.exchanges if agent_of(body) == SUPERVISOR]
    worker_starts = sorted(arrival for arrival, _, body in model.exchanges if agent_of(body).startswith("Hop "))
    values = []
    for start in worker_starts:
        asked = max(end for end in supervisor_ends if end <= start)
        values.append((start - asked) * 1000)
    return values


@dataclasses.dataclass(frozen=True)
class VerifiedSample:
    wall_s: float
    completed: supervisor_pb2.RunCompletedEvent


async def verification_cost(
    rounds: Rounds, model: ScriptedModel, site: FixtureWeb, client: RunsClient, latency: float, index: int
) -> None:
    """One run with verification off and one on (order alternating by round): calls, tokens and wall time."""
    modes = {"off": supervisor_pb2.VERIFICATION_MODE_OFF, "on": supervisor_pb2.VERIFICATION_MODE_ON}
    samples: dict[str, VerifiedSample] = {}
    for mode in rounds.order(list(modes), index):
        script = EvidenceScript(site_url=site.base_url)  # a fresh script: each run consumes its own
        tower_scenario(script, site)
        model.default = counting(script, latency)
        started = time.perf_counter()
        events = await run_once(client, QUESTION, modes[mode])
        samples[mode] = VerifiedSample(time.perf_counter() - started, events[-1].completed)
        assert script.unanswered == [], script.unanswered
        if mode == "on":  # where the review's tokens go: each role's requests, as the model counts them
            for role, prefix in REVIEW_AGENTS.items():
                sent = [
                    body for agent, bodies in script.requests.items() if agent.startswith(prefix) for body in bodies
                ]
                rounds.record(f"{role}: calls", len(sent))
                rounds.record(f"{role}: prompt tokens", sum(len(json.dumps(b["messages"])) // 4 for b in sent))
                tools = sum(len(json.dumps(b.get("tools", []))) // 4 for b in sent)
                rounds.record(f"{role}: tool-schema tokens (not counted above)", tools)
    for mode, sample in samples.items():
        total = sample.completed.usage.total
        rounds.record(f"model calls, verification {mode}", total.model_calls)
        rounds.record(f"tokens, verification {mode}", total.input_tokens + total.output_tokens, "tokens")
        rounds.record(f"wall, verification {mode}", sample.wall_s, "s")
    on = samples["on"].completed
    rounds.record("evidence roles' tokens", on.usage.verification.input_tokens + on.usage.verification.output_tokens)
    settled = on.verification
    rounds.record("supported claims (verification on)", settled.supported_claims)
    rounds.record("removed claims (verification on)", settled.removed_claims)
    # The goal's budget: 2.5x the unverified run's tokens, half of it held back for the review (the reserve).
    off = samples["off"].completed.usage.total
    script = EvidenceScript(site_url=site.base_url)
    tower_scenario(script, site)
    model.default = counting(script, latency)
    budget = int(2.5 * (off.input_tokens + off.output_tokens))
    tight = (await run_once(client, QUESTION, supervisor_pb2.VERIFICATION_MODE_ON, max_tokens=budget))[-1].completed
    used = tight.usage.total.input_tokens + tight.usage.total.output_tokens
    rounds.record("budget 2.5x off: tokens used / budget", 100 * used / budget, "%")
    unverified = sum(f.judgement == supervisor_pb2.CLAIM_JUDGEMENT_UNVERIFIED for f in tight.verification.findings)
    unaudited = sum(s.status == supervisor_pb2.SENTENCE_STATUS_UNAUDITED for s in tight.verification.sentences)
    rounds.record("budget 2.5x off: findings unverified", unverified)
    rounds.record("budget 2.5x off: sentences unaudited", unaudited)
    incomplete = supervisor_pb2.RUN_WARNING_CODE_VERIFICATION_INCOMPLETE
    rounds.record("budget 2.5x off: warned incomplete", int(any(w.code == incomplete for w in tight.warnings)))


def main() -> None:
    asyncio.run(main_async(arguments(__doc__, page_kb=200, latency=0.3, hops=30, verification=1, rounds=MIN_ROUNDS)))


if __name__ == "__main__":
    main()
