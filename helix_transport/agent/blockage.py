"""Which of a step's calls wait only for a suspended child.

A parent's call that follows a child (a remote tool, a companion's turn, a
``run_subagent`` batch) reports here when the child logs ``suspended`` and when it
moves on. The step's other calls keep running; once every call still running waits
only for suspended children, the step stops following them (their tasks are
cancelled: nothing they forwarded is lost) and the session suspends in turn. A
parent suspends only when it has nothing else to do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class BlockedChild:
    """The child a call waits for, and the last of its sequences the parent logged."""

    child_session_id: str
    address: str
    last_sequence: int


class Blockage:
    """The blocked calls of one step, by tool call id."""

    def __init__(self) -> None:
        self.blocked: dict[str, BlockedChild] = {}
        self._changed = asyncio.Event()

    def block(self, tool_call_id: str, child: BlockedChild) -> None:
        """``tool_call_id`` waits for ``child``, which is suspended."""
        self.blocked[tool_call_id] = child
        self._changed.set()

    def unblock(self, tool_call_id: str) -> None:
        """``tool_call_id``'s child moved on."""
        if self.blocked.pop(tool_call_id, None) is not None:
            self._changed.set()

    async def settle(self, tasks: Mapping[str, asyncio.Task[Any]]) -> dict[str, BlockedChild]:
        """Wait until every task in ``tasks`` (by call id) is done or blocked; cancel the
        blocked ones then. Returns what each cancelled call waited for."""
        # One done-callback per task, each dropping its call from ``running`` and waking
        # this loop: linear in the calls. ``asyncio.wait`` over the running ones at every
        # wake-up was quadratic (it adds and removes a callback on each still running):
        # 12% of a parent's CPU fanning out to 1,000 children in one step.
        running = {cid for cid, task in tasks.items() if not task.done()}
        callbacks = {cid: self._finished_callback(running, cid) for cid in running}
        for cid, callback in callbacks.items():
            tasks[cid].add_done_callback(callback)
        try:
            while running:
                if running <= self.blocked.keys():
                    for cid in running:
                        tasks[cid].cancel()
                    return {cid: self.blocked[cid] for cid in running}
                self._changed.clear()
                await self._changed.wait()
            return {}
        finally:
            for cid, callback in callbacks.items():
                tasks[cid].remove_done_callback(callback)

    def _finished_callback(self, running: set[str], cid: str) -> Callable[[Any], None]:
        def finished(_: Any) -> None:
            running.discard(cid)
            self._changed.set()

        return finished


class WaitingForChildren(Exception):
    """Raised by a step hook that has nothing to do but wait for suspended children (a
    parked ``run_subagent`` batch): the session suspends, as a step whose calls all
    wait for suspended children does."""

    def __init__(self, children: Sequence[BlockedChild]) -> None:
        super().__init__(f"waiting for {len(children)} suspended child(ren)")
        self.children = list(children)
