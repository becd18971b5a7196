"""Tools the model may call: typed parameters, capability expansion, and correlated execution.

Every tool call gets exactly one result, in the order the model made the
calls, whatever happens: an unknown tool, arguments that do not validate, a
tool that reports a problem, or a tool that crashes all become error results
the model can read and act on. Only cancellation escapes.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from opentelemetry import trace
from pydantic import BaseModel, ValidationError

from quarry.agent.messages import Message, ToolCall, tool_result
from quarry.telemetry import record_failure, tracer

log = logging.getLogger(__name__)

MAX_CALLS_PER_TURN = 16

Params = TypeVar("Params", bound=BaseModel)
# Contravariant: a tool that needs less of its context serves any richer one.
Context = TypeVar("Context", contravariant=True)
# A capability's name: a service's own enumeration of them, or plain strings.
CapabilityName = TypeVar("CapabilityName", bound=str)


_current_call: contextvars.ContextVar[ToolCall] = contextvars.ContextVar("quarry_tool_call")


def current_call() -> ToolCall:
    """The call a tool is running for (each call runs in its own task, so parallel calls each see theirs)."""
    return _current_call.get()


class ToolError(Exception):
    """A problem the model should hear about as the tool's result, e.g. "page not read yet"."""


@dataclass(frozen=True)
class Tool(Generic[Params, Context]):
    name: str
    description: str
    parameters: type[Params]
    run: Callable[[Params, Context], Awaitable[str]]
    # The calls of one turn to a tool that writes where order shows (a scratchpad append takes the next
    # sequence number) run one after another, in the order the model gave them, so that a run repeats
    # exactly; calls to other tools still run beside them.
    in_order: bool = False

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool declaration (built once per tool: pydantic's schema generation is slow)."""
        return _declaration(self.name, self.description, self.parameters)


@functools.cache
def _declaration(name: str, description: str, parameters: type[BaseModel]) -> dict[str, Any]:
    schema = parameters.model_json_schema()
    schema.pop("title", None)
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


@dataclass(frozen=True)
class ToolOutcome:
    call: ToolCall
    content: str
    is_error: bool

    def message(self) -> Message:
        return tool_result(self.call.id, self.content)


class ToolRegistry(Generic[Context]):
    """The concrete tools one role carries, looked up by name.

    `unlisted` tools answer calls without being offered to the model: a role's answer to a call it was
    not meant to make (another role's output tool, which it refuses with a reason instead of "no such tool").
    """

    def __init__(self, tools: Iterable[Tool[Any, Context]], *, unlisted: Iterable[Tool[Any, Context]] = ()) -> None:
        self._tools: dict[str, Tool[Any, Context]] = {}
        listed = list(tools)
        for tool in [*listed, *unlisted]:
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool
        self._listed = [tool.name for tool in listed]

    @classmethod
    def for_capabilities(
        cls,
        catalog: Iterable[Tool[Any, Context]],
        capabilities: Mapping[CapabilityName, Sequence[str]],
        subscribed: Sequence[CapabilityName],
    ) -> ToolRegistry[Context]:
        """Expand the logical capabilities a role subscribes to into its concrete tools."""
        by_name = {tool.name: tool for tool in catalog}
        unknown = [name for name in subscribed if name not in capabilities]
        if unknown:
            raise ValueError(f"unknown capabilities: {', '.join(unknown)}")
        names = [tool for capability in subscribed for tool in capabilities[capability]]
        missing = [name for name in names if name not in by_name]
        if missing:
            raise ValueError(f"capabilities name tools that do not exist: {', '.join(missing)}")
        return cls(by_name[name] for name in dict.fromkeys(names))

    @property
    def names(self) -> list[str]:
        """The tools offered to the model."""
        return list(self._listed)

    def schemas(self) -> list[dict[str, Any]]:
        return [self._tools[name].schema() for name in self._listed]

    async def run_calls(self, calls: Sequence[ToolCall], context: Context) -> list[ToolOutcome]:
        """Run the calls of one assistant message concurrently; one outcome per call, in call order.

        At most MAX_CALLS_PER_TURN run; the rest are answered with an error, so that
        every call still gets its result and one reply cannot fan out without bound.
        """
        running: list[Awaitable[ToolOutcome]] = []
        last_in_order: asyncio.Task[ToolOutcome] | None = None
        for call in calls[:MAX_CALLS_PER_TURN]:
            tool = self._tools.get(call.name)
            if tool is not None and tool.in_order:
                last_in_order = asyncio.ensure_future(self._run_after(last_in_order, call, context))
                running.append(last_in_order)
            else:
                running.append(self._run_one(call, context))
        outcomes = list(await asyncio.gather(*running))
        for call in calls[MAX_CALLS_PER_TURN:]:
            message = f"error: at most {MAX_CALLS_PER_TURN} tool calls run per turn; repeat this one later"
            outcomes.append(ToolOutcome(call, message, True))
        return outcomes

    async def _run_after(
        self, before: asyncio.Task[ToolOutcome] | None, call: ToolCall, context: Context
    ) -> ToolOutcome:
        if before is not None:
            await asyncio.wait({before})  # its outcome is its own: this call runs whatever it was
        return await self._run_one(call, context)

    async def _run_one(self, call: ToolCall, context: Context) -> ToolOutcome:
        _current_call.set(call)
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
        }
        # Named after the tool only when it exists: the model can make up names of any length.
        name = f"execute_tool {call.name}" if call.name in self._tools else "execute_tool"
        with tracer.start_as_current_span(name, attributes=attributes) as span:
            outcome = await self._outcome(call, context)
            span.set_attribute("quarry.tool.outcome", "error" if outcome.is_error else "ok")
            if outcome.is_error:
                span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.content[:200]))
            return outcome

    async def _outcome(self, call: ToolCall, context: Context) -> ToolOutcome:
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(self._listed) or "none"  # what this role was offered, never an unlisted tool
            return ToolOutcome(call, f"error: there is no tool named {call.name!r}; available: {known}", True)
        try:
            params = tool.parameters.model_validate_json(call.arguments or "{}")
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in error.errors()
            )
            return ToolOutcome(call, f"error: invalid arguments for {call.name}: {problems}", True)
        try:
            return ToolOutcome(call, await tool.run(params, context), False)
        except ToolError as error:
            return ToolOutcome(call, f"error: {error}", True)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being cancelled: let it through
            # A library raised CancelledError on its own (e.g. a call on a closed channel): a tool failure.
            log.warning("tool %s raised CancelledError without being cancelled (call %s)", call.name, call.id)
            return ToolOutcome(call, f"error: {call.name} was interrupted; try again", True)
        except Exception as error:
            log.exception("tool %s failed (call %s)", call.name, call.id)
            record_failure(trace.get_current_span(), error)
            return ToolOutcome(call, f"error: {call.name} failed unexpectedly; try another approach", True)
