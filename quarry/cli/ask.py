"""`quarry ask`: a research run from a terminal, and what the client commands share (finding the supervisor,
showing a run's warnings and usage, ending with the right status). `quarry runs` is runs.py.

`ask` starts a run and follows it: live with rich (delegations and their
turns, scratchpad entries as they land, the report as it streams), or one JSON
object per event with --json. Ctrl-C cancels the run and waits for its
cancelled event; a second Ctrl-C leaves at once. When the supervisor goes away
mid-run, it says so at once and waits for it (a restarted `quarry up` serves it
again, maybe on new ports), then follows the run from the last event it showed;
after --wait-for-supervisor seconds it gives up with EXIT_SUPERVISOR_LOST and the
`quarry runs watch` command that takes the run up again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

from quarry.cli.terminal import clean, safe_markup, shown
from quarry.clients.campaigns import CampaignsClient
from quarry.clients.retry import RetryPolicy
from quarry.clients.runs import RunsClient, is_terminal
from quarry.convert import enum_label
from quarry.errors import Unavailable
from quarry.v1 import common_pb2, scratchpad_pb2, supervisor_pb2

EXIT_FAILED = 1
EXIT_CANCELLED = 130
# The run completed, but its review did not finish: some cited sentences are marked unverified.
EXIT_UNVERIFIED = 3
# The supervisor went away mid-run and did not come back in time; the run may well go on without the command.
EXIT_SUPERVISOR_LOST = 4
SUPERVISOR_LOST = "the supervisor went away; waiting for it (Ctrl-C to stop)"
SUPERVISOR_BACK = "the supervisor is back; following the run again"
# Seconds between asking whether a supervisor that went away is back.
BACK_POLL_SECONDS = 1.0
_SHOWN_ENTRIES = 8
# What a succeeded run's warnings say here; one this build does not know is shown in the server's words.
_WARNINGS = {
    supervisor_pb2.RUN_WARNING_CODE_NO_DELEGATIONS: "0 sources: the model never searched",
    supervisor_pb2.RUN_WARNING_CODE_NO_SOURCES: "0 sources: no verified finding was cited",
    supervisor_pb2.RUN_WARNING_CODE_USAGE_ESTIMATED: "tokens estimated: the model server reported no usage",
    supervisor_pb2.RUN_WARNING_CODE_VERIFICATION_INCOMPLETE: (
        "not fully verified: the review did not finish (findings no verifier judged are not cited, sentences no "
        "auditor judged are marked (unverified)); give the run more --max-tokens or time, or, for a model that "
        "cannot play the review's roles, ask with --verification off"
    ),
    supervisor_pb2.RUN_WARNING_CODE_ROLES_CANNOT_FOLLOW_CONTRACTS: (
        "the model cannot play the review's roles: half or more of its verifiers, auditors and adjudicators "
        "ended without a valid output; ask again with --verification off (or serve those roles a stronger model)"
    ),
}
# How long a command waits for the supervisor to answer at all before saying it is not running;
# the calls after that retry for RetryPolicy.total_seconds, which would be a silent half minute.
REACH = RetryPolicy(total_seconds=1.0, attempt_timeout=1.0)


@dataclass(frozen=True)
class Supervisor:
    """Where the client commands find the supervisor: its address, and a channel to it (TLS and token chosen)."""

    address: str
    open_channel: Callable[[], grpc.aio.Channel]
    # Where the supervisor is now: the address found again (a `quarry up` restarted on new ports). None: here.
    find_again: Callable[[], Supervisor] | None = None

    def current(self) -> Supervisor:
        return self.find_again() if self.find_again is not None else self

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[RunsClient]:
        """A client, once the supervisor has answered; Unavailable, in about a second, when nothing answers."""
        channel = self.open_channel()
        async with RunsClient(channel) as client:
            await self._reachable(health_pb2_grpc.HealthStub(channel))
            yield client

    @contextlib.asynccontextmanager
    async def campaigns(self) -> AsyncIterator[CampaignsClient]:
        """The campaign API of the same supervisor (same address, same token), once it has answered."""
        channel = self.open_channel()
        try:
            await self._reachable(health_pb2_grpc.HealthStub(channel))
            yield CampaignsClient(channel)
        finally:
            await channel.close(None)

    async def _reachable(self, health: health_pb2_grpc.HealthStub) -> None:
        try:
            await REACH.call(health.Check, health_pb2.HealthCheckRequest())
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                raise Unavailable(
                    f"no supervisor answers at {self.address} ({error.details()}); start it with `quarry up`, "
                    "or name where it runs with --address or QUARRY_SUPERVISOR_ADDRESS (or the --data-dir of the "
                    "quarry up that runs it)"
                ) from None
            # Slow to answer, or a proxy without the health service: the command's own calls decide.


def name_of(enum: Any, value: int) -> str:
    """An enum value as words: RUN_STATE_SUCCEEDED -> "succeeded"; a value this build does not know (a newer
    server's, or one retired since an old run was recorded) as its number."""
    try:
        return enum_label(enum, value).replace("_", " ")
    except ValueError:
        return f"unknown ({value})"


@dataclass
class _Delegation:
    objective: str
    progress: str = "delegated"
    outcome: str = ""
    worker: str = ""
    # Why it failed, in the worker's words (a model endpoint it cannot reach, say).
    error: str = ""


@dataclass
class RunView:
    """What the live display shows, folded from the events so far."""

    question: str
    phase: str = "starting"
    delegations: dict[str, _Delegation] = field(default_factory=dict)
    entries: list[str] = field(default_factory=list)
    report: str = ""
    run_id: str = ""
    awaiting_approval: str = ""  # what the run said when it began to wait for a decision

    def apply(self, event: supervisor_pb2.RunEvent) -> None:
        payload = event.WhichOneof("payload")
        if payload == "status":
            status = event.status
            self.phase = name_of(supervisor_pb2.ResearchPhase, status.phase)
            if status.phase == supervisor_pb2.RESEARCH_PHASE_AWAITING_APPROVAL:
                self.awaiting_approval = status.message
            elif status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_DELEGATED:
                self.delegations[status.delegation_id] = _Delegation(status.message)
            elif status.delegation_id in self.delegations:
                delegation = self.delegations[status.delegation_id]
                delegation.worker = status.worker_id or delegation.worker
                if status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING:
                    delegation.progress = status.message
                elif status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_COMPLETED:
                    delegation.outcome = "[green]succeeded[/]"
                elif status.phase == supervisor_pb2.RESEARCH_PHASE_WORKER_FAILED:
                    code = name_of(common_pb2.DelegationErrorCode, status.delegation_error.code)
                    delegation.outcome = f"[red]failed: {code}[/]"
                    delegation.error = status.delegation_error.message
        elif payload == "scratchpad":
            entry = event.scratchpad
            kind = name_of(scratchpad_pb2.EntryKind, entry.kind)
            self.entries.append(f"[{entry.scratchpad_sequence_no}] {kind}: {clean(entry.preview)}")
        elif payload == "content":
            self.report += event.content.delta

    def failures(self) -> Counter[str]:
        """Why delegations failed, each reason with how many it stopped: the live table is gone by the end."""
        return Counter(delegation.error for delegation in self.delegations.values() if delegation.error)

    def render(self) -> RenderableType:
        parts: list[RenderableType] = [Text.assemble(shown(self.question, "bold"), "  ", (self.phase, "dim"))]
        if self.delegations:
            table = Table("delegation", "task", "worker", "progress", "outcome", expand=True)
            for delegation_id, delegation in self.delegations.items():
                table.add_row(
                    shown(delegation_id.rsplit(".", 2)[-2]),
                    shown(delegation.objective, limit=80),
                    shown(delegation.worker),
                    shown(delegation.progress),
                    Text.from_markup(delegation.outcome),  # written here, from the outcome's name
                )
            parts.append(table)
        if self.entries:
            latest = [Text(line[:160]) for line in self.entries[-_SHOWN_ENTRIES:]]
            parts.append(Group(Text("scratchpad", style="bold"), *latest))
        if self.report:
            parts.append(Markdown(clean(self.report)))
        if self.awaiting_approval:
            parts.append(Text.from_markup(approval_hint(self.run_id, self.awaiting_approval)))
        return Group(*parts)


def approval_hint(run_id: str, message: str) -> str:
    return (
        f"[bold yellow]{safe_markup(message)}[/]\n"
        f"  quarry runs approve {run_id} [--comment TEXT]   or   quarry runs reject {run_id} --reason TEXT"
    )


def print_warnings(console: Console, warnings: Iterable[supervisor_pb2.RunWarning]) -> None:
    for warning in warnings:
        console.print(shown(_WARNINGS.get(warning.code, warning.message), "bold yellow"))


def summary(console: Console, event: supervisor_pb2.RunEvent) -> None:
    """How a run ended: its report and citations, warnings and notes, or why it failed; then its usage."""
    payload = event.WhichOneof("payload")
    if payload == "completed":
        completed = event.completed
        console.print(Markdown(clean(completed.report.markdown)))
        if completed.report.citations:
            table = Table("#", "source", "quote", "entry", title="citations")
            for citation in completed.report.citations:
                table.add_row(
                    str(citation.number),
                    shown(citation.title or citation.url),
                    shown(citation.excerpt, limit=100),
                    str(citation.scratchpad_sequence_no),
                )
            console.print(table)
        print_warnings(console, completed.warnings)
        notes = []
        if completed.removed_citations:
            notes.append(f"{completed.removed_citations} unverifiable citation(s) removed")
        if completed.token_budget_exhausted:
            notes.append("the token budget stopped further research")
        if completed.turn_budget_exhausted:
            notes.append("the turn bound stopped further research")
        if notes:
            console.print(Text("; ".join(notes), style="dim"))
        usage = completed.usage
    elif payload == "failed":
        error = event.failed.error
        code = name_of(supervisor_pb2.RunErrorCode, error.code)
        console.print(f"[red]run failed[/] ({code}): {safe_markup(error.message)}")
        usage = event.failed.usage
    else:
        console.print(f"[yellow]run cancelled[/]: {safe_markup(event.cancelled.reason)}")
        usage = event.cancelled.usage
    console.print(Text(usage_line(usage), style="dim"))


def usage_line(usage: supervisor_pb2.RunUsage) -> str:
    """Tokens and model calls by tier, then in all: "tokens: supervisor 770 in 3 calls, workers ..."."""
    parts = []
    for name, tier in [("supervisor", usage.supervisor), ("workers", usage.workers), ("total", usage.total)]:
        calls = f"{tier.model_calls} call" if tier.model_calls == 1 else f"{tier.model_calls} calls"
        parts.append(f"{name} {tier.input_tokens + tier.output_tokens} in {calls}")
    return "tokens: " + ", ".join(parts)


def exit_code(event: supervisor_pb2.RunEvent | None) -> int:
    if event is not None and event.HasField("completed"):
        unverified = {
            supervisor_pb2.RUN_WARNING_CODE_VERIFICATION_INCOMPLETE,
            supervisor_pb2.RUN_WARNING_CODE_ROLES_CANNOT_FOLLOW_CONTRACTS,
        }
        return EXIT_UNVERIFIED if any(w.code in unverified for w in event.completed.warnings) else 0
    return EXIT_CANCELLED if event is not None and event.HasField("cancelled") else EXIT_FAILED


class SupervisorLost(Exception):
    """The supervisor went away mid-stream and did not answer again within the time given."""


def watch_hint(run_id: str) -> str:
    return f"follow it again with: quarry runs watch {run_id}"


async def _back(supervisor: Supervisor, wait_seconds: float) -> Supervisor:
    """The supervisor once it answers again, wherever it serves now; SupervisorLost after `wait_seconds`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while True:
        current = supervisor.current()
        try:
            async with current.connect():
                return current
        except Unavailable:
            pass
        except grpc.aio.AioRpcError as error:
            if error.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise SupervisorLost
        await asyncio.sleep(min(BACK_POLL_SECONDS, remaining))


async def run_events(
    supervisor: Supervisor,
    run_id: str,
    *,
    wait_seconds: float,
    say: Callable[[str], None],
    waiting: Callable[[bool], None] = lambda _: None,
) -> AsyncIterator[supervisor_pb2.RunEvent]:
    """The run's events in order until its terminal one, across the supervisor going away: `say` is told at
    once, and the stream goes on after the last event received when a supervisor answers again (`waiting` is
    told when the wait begins and ends); SupervisorLost after `wait_seconds` without one."""
    after, current = 0, supervisor
    while True:
        try:
            async with current.connect() as client:
                async for event in client.stream_run(run_id, after_sequence_no=after, max_reconnects=0):
                    after = event.sequence_no
                    yield event
                    if is_terminal(event):
                        return
                return
        except Unavailable:
            pass
        except grpc.aio.AioRpcError as error:
            if error.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
        say(SUPERVISOR_LOST)
        waiting(True)
        current = await _back(supervisor, wait_seconds)
        waiting(False)
        say(SUPERVISOR_BACK)


async def ask(
    supervisor: Supervisor,
    question: str,
    options: supervisor_pb2.RunOptions,
    *,
    as_json: bool,
    wait_seconds: float = 120.0,
) -> int:
    async with supervisor.connect() as client:
        run = await client.start_run(question, options=options)
    if not as_json:
        Console().print(f"[dim]run {run.run_id} (Ctrl-C cancels it)[/]")
    return await follow(supervisor, run.run_id, question, as_json=as_json, wait_seconds=wait_seconds, cancel=True)


async def follow(
    supervisor: Supervisor, run_id: str, question: str, *, as_json: bool, wait_seconds: float, cancel: bool
) -> int:
    """Follow the run to its end, live or as JSON lines; its exit status. Ctrl-C cancels it when `cancel` (a second
    leaves at once), else leaves it running; while the supervisor is away, Ctrl-C leaves at once."""
    console = Console()
    interrupted = asyncio.Event()
    away = False
    loop = asyncio.get_running_loop()

    def say(message: str) -> None:
        print(f"quarry: {message}", file=sys.stderr, flush=True)

    def waiting(now: bool) -> None:
        nonlocal away
        away = now

    def on_interrupt() -> None:
        if away or not cancel:
            say(f"left the run {run_id} as it is; {watch_hint(run_id)}")
            raise SystemExit(EXIT_CANCELLED)
        if interrupted.is_set():
            raise SystemExit(EXIT_CANCELLED)  # a second Ctrl-C: leave now
        interrupted.set()

    async def cancel_when_interrupted() -> None:
        await interrupted.wait()
        try:
            async with supervisor.current().connect() as client:
                await client.cancel_run(run_id, reason="cancelled from quarry ask (Ctrl-C)")
        except (Unavailable, grpc.aio.AioRpcError) as error:
            say(f"the run could not be cancelled: {clean(str(error))}")

    loop.add_signal_handler(signal.SIGINT, on_interrupt)
    canceller = asyncio.create_task(cancel_when_interrupted())
    view = RunView(question, run_id=run_id)
    last: supervisor_pb2.RunEvent | None = None
    display = contextlib.nullcontext() if as_json else Live(console=console, auto_refresh=False, transient=True)
    try:
        with display as live:
            async for last in run_events(supervisor, run_id, wait_seconds=wait_seconds, say=say, waiting=waiting):
                if as_json:
                    print(json.dumps(json_format.MessageToDict(last)), flush=True)
                elif live is not None:
                    view.apply(last)
                    live.update(view.render(), refresh=True)
    except SupervisorLost:
        say(
            f"the supervisor did not come back within {wait_seconds:g} s; the run {run_id} goes on where the mesh "
            f"runs it: {watch_hint(run_id)}"
        )
        return EXIT_SUPERVISOR_LOST
    finally:
        canceller.cancel()
        loop.remove_signal_handler(signal.SIGINT)
    if last is None or not is_terminal(last):
        print("quarry: the run's event stream ended without a result", file=sys.stderr)
        return EXIT_FAILED
    if not as_json:
        for reason, count in view.failures().items():
            console.print(f"[yellow]{count} delegation(s) failed[/]: {safe_markup(reason)}")
        summary(console, last)
    return exit_code(last)


# What to do when the supervisor wants a credential the command line did not send, or does not know it.
CREDENTIAL_HINT = (
    "the supervisor wants an API key: set QUARRY_API_KEY to one (an operator makes them with `quarry keys add`), "
    "or run the command where `quarry up` runs, which reads the key it wrote in its data directory "
    "(--data-dir); `quarry doctor` says which key is sent"
)


def describe_rpc_error(error: grpc.aio.AioRpcError) -> str:
    return f"{error.code().name}: {error.details()}"


def run_client_command(command: Coroutine[Any, Any, int]) -> int:
    """Run a client command; a refusal from the service, or no service, is one line on stderr, not a traceback."""
    try:
        return asyncio.run(command)
    except grpc.aio.AioRpcError as error:
        print(f"quarry: {clean(describe_rpc_error(error))}", file=sys.stderr)
        if error.code() is grpc.StatusCode.UNAUTHENTICATED:
            print(f"quarry: {CREDENTIAL_HINT}", file=sys.stderr)
        return EXIT_FAILED
    except Unavailable as error:
        print(f"quarry: {clean(str(error))}", file=sys.stderr)
        return EXIT_FAILED
