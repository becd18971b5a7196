"""Work that may not end, run where it can be stopped: child processes with a time and a memory limit.

A parser fed a hostile document (a crafted PDF) can loop or allocate without bound, and a
thread cannot be stopped. Each slot of an `IsolatedPool` is one spawned child process, started
when first needed. A call that overruns its time limit, or whose caller gives up, has its child
killed (a fresh one takes the slot on the next call), so later calls are not starved; the
memory limit is the child's address space (RLIMIT_AS). `close()` kills every child.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import multiprocessing
import os
import resource
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from quarry.credentials import keep_private

T = TypeVar("T")

# How long a new child may take to start (import its modules) before the call fails.
START_SECONDS = 60.0
# How long a killed child may take to be reaped.
REAP_SECONDS = 5.0
_READY = "ready"
_PR_SET_PDEATHSIG = 1


class IsolationError(Exception):
    """A call that did not finish in its child process; the message says why."""


class TimeLimitExceeded(IsolationError):
    pass


class MemoryLimitExceeded(IsolationError):
    pass


class PoolClosed(IsolationError):
    pass


@dataclass(eq=False)
class _Child:
    process: BaseProcess
    connection: Connection


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when the thread that started it ends (even by SIGKILL)."""
    if sys.platform == "linux":
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent ended before the request took effect
            os._exit(1)


def _serve(connection: Connection, parent: int, memory_bytes: int, preload: tuple[str, ...]) -> None:
    """The child: run each (function, args) received, answer with its outcome, until the pipe closes."""
    _die_with_parent(parent)
    # It inherits the worker's environment (credentials included): no other process may read it.
    keep_private()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the parent, which kills this process
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    for module in preload:
        importlib.import_module(module)
    connection.send(_READY)
    while True:
        try:
            function, args = connection.recv()
        except EOFError:
            return
        reply: tuple[str, Any]
        try:
            reply = ("value", function(*args))
        except MemoryError:
            reply = ("memory", None)
        except Exception as error:
            reply = ("raised", error)
        try:
            connection.send(reply)
        except Exception as error:  # the value or error does not pickle; nothing was written
            connection.send(("failed", f"{type(error).__name__}: {error}"))


def _call(connection: Connection, function: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    connection.send((function, args))
    reply: tuple[str, Any] = connection.recv()
    return reply


class IsolatedPool:
    """Runs picklable functions in `workers` child processes, each call within `seconds` and `memory_bytes`."""

    def __init__(
        self, workers: int = 2, *, seconds: float, memory_bytes: int = 0, preload: tuple[str, ...] = ()
    ) -> None:
        if workers < 1:
            raise ValueError("an isolated pool needs at least one worker")
        self._workers = workers
        self._seconds = seconds
        self._memory_bytes = memory_bytes
        self._preload = preload
        self._context = multiprocessing.get_context("spawn")  # no fork of a threaded (gRPC, asyncio) process
        self._idle: list[_Child] = []
        self._children: set[_Child] = set()  # every live child, idle or busy
        self._slots: asyncio.Semaphore | None = None
        # One thread per busy child waits on its pipe; a killed child ends the wait (end of file).
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="isolated")
        self._closed = False

    @property
    def seconds(self) -> float:
        return self._seconds

    @property
    def memory_bytes(self) -> int:
        return self._memory_bytes

    def pids(self) -> list[int]:
        """Process ids of the live children."""
        return [child.process.pid for child in self._children if child.process.pid is not None]

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` in a child; its exceptions are raised here, limits as `IsolationError`s."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._workers)
        async with self._slots:
            if self._closed:
                raise PoolClosed("the pool is closed")
            child = self._idle.pop() if self._idle else await self._start()
            healthy = False
            try:
                loop = asyncio.get_running_loop()
                async with asyncio.timeout(self._seconds):
                    kind, value = await loop.run_in_executor(self._threads, _call, child.connection, function, args)
                healthy = kind in ("value", "raised", "failed")
            except TimeoutError:
                raise TimeLimitExceeded(f"it did not finish within {self._seconds:g} s") from None
            except (EOFError, OSError) as error:
                if self._closed:
                    raise PoolClosed("the pool was closed during the call") from None
                child.process.join(REAP_SECONDS)
                raise IsolationError(f"its process ended (exit code {child.process.exitcode})") from error
            finally:
                if healthy and not self._closed:
                    self._idle.append(child)
                else:  # overran, cancelled, out of memory or dead: a fresh child takes the slot next time
                    self._kill(child)
        if kind == "memory":
            raise MemoryLimitExceeded(f"it needed more than the {self._memory_bytes // 2**20} MiB it may use")
        if kind == "raised":
            raise value
        if kind == "failed":
            raise IsolationError(f"its outcome could not be sent back ({value})")
        result: T = value
        return result

    async def _start(self) -> _Child:
        parent_end, child_end = self._context.Pipe()
        process = self._context.Process(
            target=_serve,
            args=(child_end, os.getpid(), self._memory_bytes, self._preload),
            name="quarry-isolated",
            daemon=True,  # also killed when the interpreter exits without close()
        )
        process.start()
        child_end.close()
        child = _Child(process, parent_end)
        self._children.add(child)
        try:
            async with asyncio.timeout(START_SECONDS):
                ready = await asyncio.get_running_loop().run_in_executor(self._threads, parent_end.recv)
            if ready != _READY:
                raise IsolationError(f"its process started with {ready!r}")
        except (TimeoutError, EOFError, OSError) as error:
            self._kill(child)
            raise IsolationError(f"its process did not start ({type(error).__name__})") from None
        except BaseException:
            self._kill(child)
            raise
        return child

    def _kill(self, child: _Child) -> None:
        """Kill and reap the child; the pipe closes with its last reference (a waiting thread may hold it)."""
        self._children.discard(child)
        if child in self._idle:
            self._idle.remove(child)
        if child.process.is_alive():
            child.process.kill()
        child.process.join(REAP_SECONDS)

    def close(self) -> None:
        """Kill every child, busy or idle, without waiting on what they run; later calls raise `PoolClosed`."""
        self._closed = True
        for child in list(self._children):
            self._kill(child)
        self._threads.shutdown(wait=False, cancel_futures=True)
