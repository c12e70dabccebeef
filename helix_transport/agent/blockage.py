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
from collections.abc import Mapping, Sequence
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
        while True:
            running = {cid for cid, task in tasks.items() if not task.done()}
            if not running:
                return {}
            if running <= self.blocked.keys():
                for cid in running:
                    tasks[cid].cancel()
                return {cid: self.blocked[cid] for cid in running}
            self._changed.clear()
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait(
                    {changed, *(tasks[cid] for cid in running)},
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                changed.cancel()


class WaitingForChildren(Exception):
    """Raised by a step hook that has nothing to do but wait for suspended children (a
    parked ``run_subagent`` batch): the session suspends, as a step whose calls all
    wait for suspended children does."""

    def __init__(self, children: Sequence[BlockedChild]) -> None:
        super().__init__(f"waiting for {len(children)} suspended child(ren)")
        self.children = list(children)
