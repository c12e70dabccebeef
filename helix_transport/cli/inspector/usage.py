"""Usage as it is reported, before a session ends.

Events carry usage only when something ends: a terminal event (the end of a turn,
or a child's end, forwarded into its parent's log) reports its session's own usage
and its subtree's, and the fold (``helix_transport.tree``) adds each one to the
totals the moment it arrives. Between two such events a running session's own usage
so far is in its record, written with each step's checkpoint in the same write as
the step's events. So when a session's events arrive, the feed reads that record
(``GetStatus``, at most once per ``REFRESH_S`` per session) and lays what it says
over the fold's numbers (``with_live_usage``): a root that runs for minutes without
a child shows its tokens grow step by step instead of 0 until its end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport._exceptions import HelixError
from helix_transport.transport import AgentClient
from helix_transport.tree import TreeUsage

REFRESH_S = 1.0
"""The least time between two reads of the usage of the same session."""

_log = logging.getLogger(__name__)


class LiveUsage:
    """The own usage of the tree's sessions that have not ended, read from their
    services' records when their events arrive (``touched``)."""

    def __init__(self, client_for: Callable[[str], Awaitable[AgentClient]], address: str) -> None:
        self._client_for = client_for
        self._address = address  # the root's service: where a session without one lives
        self.own: dict[str, TreeUsage] = {}
        """Session id -> its own usage as its record said last."""
        self._dirty: dict[str, str] = {}  # session id -> its service's address
        self._wake = asyncio.Event()

    def touched(self, session_id: str, address: str | None) -> None:
        """``session_id`` logged something: its record may count more tokens now."""
        self._dirty[session_id] = address or self._address
        self._wake.set()

    async def run(self, changed: Callable[[], None]) -> None:
        """Read the touched sessions' usage until cancelled; ``changed`` when any grew."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, {}
            grew = await asyncio.gather(*(self._read(s, a) for s, a in dirty.items()))
            if any(grew):
                changed()
            await asyncio.sleep(REFRESH_S)

    async def _read(self, session_id: str, address: str) -> bool:
        try:
            client = await self._client_for(address)
            status = await client.get_status(session_id)
        except HelixError as exc:
            # A session another principal owns, or a service that is down: its
            # terminal event will say its usage when it ends.
            _log.debug("usage of %s at %s: %s", session_id, address, exc)
            return False
        usage = TreeUsage.from_proto(status.usage)
        before = self.own.get(session_id)
        if before is not None and usage.total_tokens <= before.total_tokens:
            return False
        self.own[session_id] = usage
        return True


def with_live_usage(node: dict[str, Any], own: dict[str, TreeUsage]) -> TreeUsage:
    """Lay ``own`` (session id -> own usage read from records) over a tree's JSON
    (``TreeNode.to_json``), in place; returns ``node``'s total.

    A session that has ended keeps what its terminal event reported (the last word);
    one that has not takes the larger of its record's and its events' own usage, and
    its total becomes that plus its children's totals, as the fold sums them.
    """
    children = sum((with_live_usage(child, own) for child in node["children"]), start=TreeUsage())
    usage = node["usage"]
    if SessionStatus(node["status"]).is_terminal:
        return _usage(usage["total"])
    live = own.get(node["session_id"])
    if live is not None and live.total_tokens > usage["own"]["total_tokens"]:
        usage["own"] = live.to_json()
    total = _usage(usage["own"]) + children
    if total.total_tokens > usage["total"]["total_tokens"]:
        usage["total"] = total.to_json()
    return _usage(usage["total"])


def _usage(raw: dict[str, int]) -> TreeUsage:
    return TreeUsage(
        prompt_tokens=raw["prompt_tokens"],
        completion_tokens=raw["completion_tokens"],
        total_tokens=raw["total_tokens"],
    )
