"""What a parent's own log holds of its children: the truth a resumed parent reads.

Kept beside ``subtree`` (the children's usage, read from the same log): one index per
run (``RunCache.log_index``), for the delegation tools (``delegation.forwarding``).
"""

from __future__ import annotations

import asyncio
import dataclasses

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.store import EventLogStore, pages


@dataclasses.dataclass
class Logged:
    """What a parent's log holds of one tool call's child."""

    started: set[str] = dataclasses.field(default_factory=set)
    """The children whose ``subagent_start`` is in the log."""
    last_sequence: int = 0
    """The last child sequence forwarded (0: none)."""
    end: pb.SubagentEnd | None = None
    """The ``subagent_end`` in the log, if the call ended."""


@dataclasses.dataclass
class ChildLogged:
    """What a parent's log holds of one child, whatever the calls that ran it."""

    starts: int = 0
    """Its ``subagent_start``s: one per turn begun."""
    ends: int = 0
    """Its ``subagent_end``s: one per turn delivered."""
    last_sequence: int = 0
    """The last child sequence forwarded (0: none)."""


class ForwardedSoFar:
    """What the parent's own log holds of each tool call's child.

    The log, not the (batched) ref, is the truth after a crash: events forwarded
    after the ref's last write are in the log and must not be forwarded again, and a
    ``subagent_start`` or ``subagent_end`` in it must not be written again. A
    resumed parent rejoins all its running children at once, so they share one pass
    over its log (``forwarded_so_far``), not one each: a thousand children would
    otherwise read a log of their thousands of events a thousand times. Each lookup
    reads what the log gained since the last pass (it only grows) unless a pass began
    after the lookup did; a rejoining call has forwarded nothing yet in this run, so
    its figure is exact.
    """

    def __init__(self, store: EventLogStore, session_id: str) -> None:
        self._store = store
        self._session_id = session_id
        self._read_to = 0
        self._calls: dict[str, Logged] = {}
        self._children: dict[str, ChildLogged] = {}
        self._lock = asyncio.Lock()  # concurrent rejoins wait for one reader
        self._passes = 0

    async def last(self, tool_call_id: str) -> int:
        """The last sequence of ``tool_call_id``'s child in the log (0: none)."""
        return (await self.logged(tool_call_id)).last_sequence

    async def logged(self, tool_call_id: str) -> Logged:
        """What the log holds of ``tool_call_id``'s child."""
        entered = self._passes
        async with self._lock:
            # A pass begun since this lookup was asked for read all it needs.
            if self._passes == entered:
                self._passes += 1
                await self._read_on()
            return self._calls.get(tool_call_id) or Logged()

    async def child(self, child_id: str) -> ChildLogged:
        """What the log holds of ``child_id``, read on to its end."""
        await self.logged("")
        return self.child_so_far(child_id)

    def child_so_far(self, child_id: str) -> ChildLogged:
        """What the last pass over the log found of ``child_id`` (no read)."""
        return self._children.get(child_id) or ChildLogged()

    async def _read_on(self) -> None:
        calls, children = self._calls, self._children
        async for events in pages(self._store, self._session_id, from_sequence=self._read_to):
            for event in events:
                kind = event.WhichOneof("payload")
                if kind == "child_event":
                    call, child = event.child_event.tool_call_id, event.child_event.event
                    logged = calls.setdefault(call, Logged())
                    logged.last_sequence = max(logged.last_sequence, child.sequence)
                    of = children.setdefault(child.session_id, ChildLogged())
                    of.last_sequence = max(of.last_sequence, child.sequence)
                elif kind == "subagent_start":
                    start = event.subagent_start
                    logged = calls.setdefault(start.tool_call_id, Logged())
                    logged.started.add(start.child_session_id)
                    children.setdefault(start.child_session_id, ChildLogged()).starts += 1
                elif kind == "subagent_end":
                    end = event.subagent_end
                    calls.setdefault(end.tool_call_id, Logged()).end = end
                    children.setdefault(end.child_session_id, ChildLogged()).ends += 1
            self._read_to = events[-1].sequence
