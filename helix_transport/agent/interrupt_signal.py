"""A run's interrupt signal: the ``asyncio.Event`` the server sets when an interrupt
for the session arrives, which the run loop races each step against.

Racing a plain ``Event`` takes a task per step (one awaiting its ``wait()``); this one
also resolves the futures it hands out when it is set, so a race needs no task.
"""

from __future__ import annotations

import asyncio
from typing import Any


class InterruptSignal(asyncio.Event):
    """An ``asyncio.Event`` that also resolves the futures ``watch`` hands out."""

    def __init__(self) -> None:
        super().__init__()
        self._watching: set[asyncio.Future[Any]] = set()

    def set(self) -> None:
        """Set the event: wake its waiters and resolve every watching future."""
        super().set()
        watching, self._watching = self._watching, set()
        for future in watching:
            if not future.done():
                future.set_result(None)

    def watch(self) -> asyncio.Future[None]:
        """A future done when the signal is set (at once if it is). Pass it to
        ``unwatch`` when no longer needed."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.is_set():
            future.set_result(None)
        else:
            self._watching.add(future)
        return future

    def unwatch(self, future: asyncio.Future[Any]) -> None:
        """Stop resolving ``future`` (``watch``'s; cancel it after)."""
        self._watching.discard(future)
