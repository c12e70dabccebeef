"""One page's live view of one session: its root's stream, folded, as messages.

The fold (``helix_transport.tree``) runs here, in the CLI process, as it does for
``helix-mesh tree``; the page only draws what it is sent:

- ``state``: ``live``, ``reconnecting`` (with what broke), ``ended`` or ``error``;
- ``events``: the events new since the last message, each unwrapped from its
  ``ChildEvent`` and tagged with the session (node) it belongs to, its kind and its
  one-line summary (``event_json``), so the page has no text of its own for any kind;
- ``tree``: the whole tree (``TreeNode.to_json``), when anything in it changed, with
  the usage the sessions' records report so far laid over it (``usage.py``): tokens
  grow while a session runs, not only when it ends.

Messages are batched (one per ``FRAME_S`` at most), so a stream of words is not a
message per word. A break in the stream (the service restarting) is resumed from
the root's last sequence, for as long as the page is open; the fold is idempotent
per sequence, so the overlap of a resumed stream changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from helix_transport._config import RetryConfig
from helix_transport._events import event_kind
from helix_transport._exceptions import HelixError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.cli.follow import session_events
from helix_transport.cli.inspector.usage import LiveUsage, with_live_usage
from helix_transport.cli.jsonout import message_json
from helix_transport.transport import AgentClient
from helix_transport.tree import SessionTree, TreeNode

FRAME_S = 0.15
"""The least time between two messages to the page."""
KEEPALIVE_S = 15.0
"""A quiet feed still sends something this often, so proxies and the browser keep it."""
STREAM_RETRY = RetryConfig(deadline=timedelta(seconds=3))
"""How long a broken stream is resumed quietly before the page is told it is
reconnecting (it goes on trying after that, with ``RECONNECT_PAUSE_S`` between)."""
RECONNECT_PAUSE_S = 1.0


@dataclass
class Message:
    """One server-sent event: its name and its JSON data."""

    name: str
    data: dict[str, Any]


@dataclass
class _Pending:
    events: list[dict[str, Any]] = field(default_factory=list)
    tree_changed: bool = False
    state: dict[str, Any] | None = None


def event_json(node: str, event: pb.StreamEvent) -> dict[str, Any]:
    """One event as the page gets it: the session it belongs to, the event, its kind
    (``unknown`` for a payload this code does not know) and its summary, as the CLI
    prints it (``lead`` in its ``tone``, then ``rest``)."""
    kind = event_kind(event)
    summary = kind.summary(event)
    return {
        "node": node,
        "event": message_json(event),
        "kind": kind.name or "unknown",
        "summary": {"lead": summary.lead, "rest": summary.rest, "tone": summary.tone.value},
    }


class TreeFeed:
    """Folds ``session_id``'s stream from ``client`` and yields what the page needs."""

    def __init__(
        self,
        client: AgentClient,
        session_id: str,
        *,
        on_address: Callable[[str], None] = lambda _: None,
        client_for: Callable[[str], Awaitable[AgentClient]] | None = None,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.tree = SessionTree()
        self.usage = LiveUsage(client_for or self._same_client, client.address)
        self.last_sequence = 0
        """The root's last sequence folded: where a resumed stream starts."""
        self._on_address = on_address  # told each child service address the tree names
        self._sent: dict[str, int] = {}  # node session id -> its events already sent
        self._pending = _Pending(state={"state": "connecting", "detail": ""})
        self._wake = asyncio.Event()
        self._wake.set()

    async def messages(self) -> AsyncIterator[Message]:
        """The page's messages until the session has ended (or cannot be read)."""
        reader = asyncio.create_task(self._read())
        usage = asyncio.create_task(self.usage.run(self._usage_grew))
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(KEEPALIVE_S):
                        await self._wake.wait()
                self._wake.clear()
                pending, self._pending = self._pending, _Pending()
                if pending.events:
                    yield Message("events", {"events": pending.events})
                if pending.tree_changed and self.tree.root is not None:
                    tree = self.tree.root.to_json()
                    with_live_usage(tree, self.usage.own)
                    yield Message("tree", {"tree": tree})
                if pending.state is not None:
                    yield Message("state", pending.state)
                elif not pending.events and not pending.tree_changed:
                    yield Message("keepalive", {})
                if reader.done() and not self._wake.is_set():
                    return
                await asyncio.sleep(FRAME_S)
        finally:
            reader.cancel()
            usage.cancel()
            await asyncio.wait({reader, usage})  # their end, without their cancellation

    async def _read(self) -> None:
        try:
            while True:
                try:
                    await self._fold_stream()
                    self._say("ended", "")
                    return
                except HelixError as exc:
                    if not exc.retryable:
                        self._say("error", str(exc))
                        return
                    self._say("reconnecting", str(exc))
                await asyncio.sleep(RECONNECT_PAUSE_S)
        finally:
            self._wake.set()

    async def _fold_stream(self) -> None:
        live = False
        events = session_events(
            self.client, self.session_id, from_sequence=self.last_sequence, retry=STREAM_RETRY
        )
        async for event in events:
            if not live:
                self._say("live", "")
                live = True
            self.last_sequence = event.sequence
            node = self.tree.add(event)
            sent = self._sent.get(node.session_id, 0)
            for new in node.events[sent:]:
                self._pending.events.append(event_json(node.session_id, new))
            self._sent[node.session_id] = len(node.events)
            if node.address:
                self._on_address(node.address)
            if not node.status.is_terminal:
                self.usage.touched(node.session_id, self._service_of(node))
            self._pending.tree_changed = True
            self._wake.set()

    def _service_of(self, node: TreeNode) -> str | None:
        """The address of ``node``'s service: its own, when its parent logged one, else
        its nearest ancestor's (a child run in its parent's process); ``None`` for the
        root's service."""
        at: TreeNode | None = node
        while at is not None and at is not self.tree.root:
            if at.address:
                return at.address
            parent = at.parent_session_id
            at = self.tree.node(parent) if parent is not None else None
        return None

    def _usage_grew(self) -> None:
        self._pending.tree_changed = True
        self._wake.set()

    async def _same_client(self, address: str) -> AgentClient:
        return self.client

    def _say(self, state: str, detail: str) -> None:
        self._pending.state = {"state": state, "detail": detail}
        self._wake.set()
