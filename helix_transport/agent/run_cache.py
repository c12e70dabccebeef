"""The library's in-memory state of one run, beside its checkpointed ``RunState``.

Never saved: a restarted run starts with a fresh ``RunCache``, so whatever it holds is
rebuilt from the store (the refs, the session's own log). One typed field per user,
so that what the run keeps, and who keeps it, can be read off this class.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from helix_transport.log.children import ForwardedSoFar
from helix_transport.tree import ChildTotals


@dataclass(kw_only=True)
class ForwardedByRun:
    """What this run forwarded itself, by child (``delegation.forwarding``)."""

    last: dict[str, int] = field(default_factory=dict)
    """The last child sequence this run emitted into the parent's log."""
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    """One forwarder per child at a time."""


@dataclass(kw_only=True)
class RunCache:
    """The run's in-memory bookkeeping, for the library's delegation tools (as
    ``ToolContext.cache`` is the tools' own)."""

    starting: set[str] = field(default_factory=set)
    """Children reserved by ``reserve_children`` whose ref is not written yet."""
    child_totals: ChildTotals = field(default_factory=ChildTotals)
    """The children's latest terminal usage, for the run's own terminal event."""
    forwarded: ForwardedByRun = field(default_factory=ForwardedByRun)
    """What this run forwarded of each child."""
    log_index: ForwardedSoFar | None = None
    """What the session's log holds of its children (made at its first use)."""
    companion_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    """One lock per companion child: tools on one child run one at a time."""
    spans_opened: set[str] = field(default_factory=set)
    """Children whose delegation span this run opened (``delegation.spans``)."""
    spans_reopened: bool = False
    """This run opened again the spans an earlier run left open."""
