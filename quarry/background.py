"""A named asyncio task that a long-lived component runs from `start()` until `stop()`."""

from __future__ import annotations

import abc
import asyncio
import contextlib

__all__ = ["BackgroundTask"]


class BackgroundTask(abc.ABC):
    """Base of the components that loop in the background (lease keeping, NOTIFY relaying), so that
    starting one under a name and cancelling it cleanly on shutdown is written once."""

    def __init__(self, task_name: str) -> None:
        self._task_name = task_name
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._task_name)

    async def stop(self) -> None:
        """Cancel the loop and wait until it has ended; nothing when it never started."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @abc.abstractmethod
    async def _run(self) -> None:
        """The loop; it runs until cancelled."""
