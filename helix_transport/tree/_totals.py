"""A session's subtree usage, from its own log: what its terminal event reports as
``total_usage`` beside its own ``usage``.

Every child's events are forwarded into its parent's log, its terminal event last, and
that event carries the child's ``total_usage`` (its own subtree's, recursively). So the
parent's subtree is the sum, over its direct children, of each child's latest terminal
``total_usage`` (a continued child reports its whole session, all turns, each time):
no child's service is asked, and none needs to be up.
"""

from __future__ import annotations

from helix_transport._events import is_terminal
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.store import EventLogStore, Usage, pages


class ChildTotals:
    """The latest terminal ``total_usage`` of each direct child, by child session id."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[int, Usage]] = {}

    def note(self, event: pb.StreamEvent) -> None:
        """A direct child's event, as forwarded (unwrapped): its usage if terminal."""
        if not is_terminal(event):
            return
        seen = self._latest.get(event.session_id)
        if seen is not None and seen[0] >= event.sequence:
            return
        own, total = reported_usage(event)
        self._latest[event.session_id] = (
            event.sequence,
            usage_from_proto(own if total is None else total),
        )

    async def read_log(self, store: EventLogStore, session_id: str) -> None:
        """Note every child's terminal event ``session_id``'s log holds: for a run that
        did not forward all of its children itself (a resumed run, a later turn)."""
        async for events in pages(store, session_id):
            for event in events:
                if event.WhichOneof("payload") == "child_event":
                    self.note(event.child_event.event)

    def total(self) -> Usage:
        """The children's usage, each child counted once."""
        total = Usage()
        for _, usage in self._latest.values():
            total = total + usage
        return total


def reported_usage(terminal: pb.StreamEvent) -> tuple[pb.TokenUsage, pb.TokenUsage | None]:
    """What a terminal event reports: its session's own usage, and its subtree's (``None``
    from a service that reports no subtree)."""
    ended = getattr(terminal, terminal.WhichOneof("payload") or "")
    return ended.usage, ended.total_usage if ended.HasField("total_usage") else None


def token_usage(usage: Usage) -> pb.TokenUsage:
    """``usage`` as the contract's ``TokenUsage``."""
    return pb.TokenUsage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        cost_usd=usage.cost_usd,
    )


def usage_from_proto(usage: pb.TokenUsage) -> Usage:
    """The contract's ``TokenUsage`` as a ``Usage``."""
    return Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        cost_usd=usage.cost_usd,
    )
