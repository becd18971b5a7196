"""The bounded tool loop: call the model, run the tools it asks for, repeat, within hard limits.

The supervisor's research runs, the workers' delegations and a campaign's THINK
all run this loop; they differ only in the tools they pass and in what they do
with the answer. A run ends in exactly
one of: an answer, TurnBudgetExhausted, TokenBudgetExhausted, or the
provider's ProviderError. A caller whose run ends with a structured output
(a tool that takes it) passes `finished`, which ends the run after the turn
whose tools delivered it. Deadlines and cancellation come from the caller
(asyncio timeouts and task cancellation) and interrupt the model call and
the tools alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from quarry.agent.conversation import ConversationStore
from quarry.agent.messages import Message, ToolCall, user
from quarry.agent.model import ModelClient
from quarry.agent.tools import ToolOutcome, ToolRegistry
from quarry.agent.truncation import truncate
from quarry.agent.usage import Usage
from quarry.telemetry import tracer

Context = TypeVar("Context")

DEFAULT_MAX_TURNS = 8


class LoopFailure(Exception):
    """The loop stopped without an answer."""


class TurnBudgetExhausted(LoopFailure):
    pass


class TokenBudgetExhausted(LoopFailure):
    pass


@dataclass(frozen=True)
class LoopLimits:
    max_turns: int = DEFAULT_MAX_TURNS
    # Input plus output tokens over the whole run; 0 means no token bound.
    max_tokens: int = 0
    # Token budget for the history sent with each model call.
    context_tokens: int = 96_000

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")


class LoopObserver:
    """Progress hooks; the default ignores everything. Never sees page text, only names and ids."""

    async def turn_started(self, turn: int, max_turns: int) -> None:
        return None

    async def tool_called(self, turn: int, call: ToolCall) -> None:
        return None

    async def tool_finished(self, turn: int, outcome: ToolOutcome) -> None:
        return None

    async def text(self, delta: str) -> None:
        return None


class AgentRun(Generic[Context]):
    """One bounded run over one conversation. `turns` and `usage` stay readable after a failure."""

    def __init__(
        self,
        model: ModelClient,
        tools: ToolRegistry[Context],
        store: ConversationStore,
        conversation_id: str,
        limits: LoopLimits,
        observer: LoopObserver | None = None,
        *,
        agent: str = "agent",
        finished: Callable[[int], bool] | None = None,
    ) -> None:
        self._agent = agent  # names its spans: "supervisor turn", "worker turn"
        # Asked after each turn whose tools ran, with its number: True ends the run there, answering "".
        self._finished = finished
        self._model = model
        self._tools = tools
        self._store = store
        self._conversation_id = conversation_id
        self._limits = limits
        self._observer = observer or LoopObserver()
        self.turns = 0
        self.usage = Usage()

    async def run(self, context: Context, history: list[Message] | None = None) -> str:
        """Loop until the model answers without calling a tool (or `finished` says so); returns that answer.

        A run may be called again to go on with the same conversation: its turn budget is shared.

        `history` is the conversation as stored, when the caller has it (it just wrote it); otherwise
        it is read. This run is the conversation's only writer, so the copy is then kept in step.
        """
        schemas = self._tools.schemas()
        if history is None:
            history = await self._store.history(self._conversation_id)
        # A conversation recorded by an earlier process (one that stopped mid-run) goes on where it stopped:
        # its recorded turns count, and calls it recorded without their results are run now.
        self.turns = max(self.turns, sum(1 for message in history if message.role == "assistant"))
        unanswered = unanswered_calls(history)
        if unanswered:
            outcomes = await self._run_tools(self.turns, unanswered, context)
            results = [outcome.message() for outcome in outcomes]
            await self._store.append(self._conversation_id, results)
            history.extend(results)
            if self._finished is not None and self._finished(self.turns):
                return ""
        while self.turns < self._limits.max_turns:
            self.turns += 1
            turn = self.turns
            await self._observer.turn_started(turn, self._limits.max_turns)  # may stop the run before the call
            self.usage += Usage(model_calls=1)  # counted when made, so a call that fails counts too
            attributes = {"quarry.turn": turn, "quarry.max_turns": self._limits.max_turns}
            with tracer.start_as_current_span(f"{self._agent} turn", attributes=attributes):
                answer = await self._turn(turn, schemas, history, context)
            if answer is not None:
                return answer
        raise TurnBudgetExhausted(f"no answer within {self._limits.max_turns} turns")

    async def _turn(
        self, turn: int, schemas: list[dict[str, Any]], history: list[Message], context: Context
    ) -> str | None:
        """One model call and the tools it asks for; the answer when it asked for none."""
        context_window = truncate(history, self._limits.context_tokens)
        reply = await self._model.complete(
            context_window, schemas, call_id_prefix=f"t{turn}", on_text=self._observer.text
        )
        self.usage += reply.usage
        calls = reply.message.tool_calls
        if self._over_tokens() or (not calls and not reply.protocol_errors):
            await self._store.append(self._conversation_id, [reply.message])
            history.append(reply.message)
            self._check_tokens()
            return reply.message.content
        # The answer is recorded before its tools run, so a process that stops while they run never asks the
        # model for it again: the next one runs the recorded calls (their ids make delegations and appends
        # idempotent). Their results follow in one write, before the model sees them.
        await self._store.append(self._conversation_id, [reply.message])
        history.append(reply.message)
        outcomes = await self._run_tools(turn, calls, context)
        follow_up: list[Message] = [outcome.message() for outcome in outcomes]
        if reply.protocol_errors:
            follow_up.append(user("Some tool_call blocks could not be used: " + "; ".join(reply.protocol_errors)))
        await self._store.append(self._conversation_id, follow_up)
        history.extend(follow_up)
        if self._finished is not None and self._finished(turn):
            return ""
        return None

    async def _run_tools(self, turn: int, calls: Sequence[ToolCall], context: Context) -> list[ToolOutcome]:
        self.usage += Usage(tool_calls=len(calls))
        for call in calls:
            await self._observer.tool_called(turn, call)
        outcomes = await self._tools.run_calls(calls, context)
        for outcome in outcomes:
            await self._observer.tool_finished(turn, outcome)
        return outcomes

    def _over_tokens(self) -> bool:
        return bool(self._limits.max_tokens) and self.usage.tokens > self._limits.max_tokens

    def _check_tokens(self) -> None:
        spent = self.usage.tokens
        if self._over_tokens():
            raise TokenBudgetExhausted(f"{spent} tokens used, over the budget of {self._limits.max_tokens}")


def unanswered_calls(history: Sequence[Message]) -> tuple[ToolCall, ...]:
    """The tool calls of the last assistant message when no result follows it: recorded by a process that
    stopped before its tools ended (results are recorded together, so there are all of them or none)."""
    for message in reversed(history):
        if message.role == "tool":
            return ()
        if message.role == "assistant":
            return message.tool_calls
    return ()
