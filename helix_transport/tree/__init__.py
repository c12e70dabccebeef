"""The delegation tree, folded from one log: the root session's events, children nested.

A parent forwards every event of each child into its own log as a ``ChildEvent``
(a grandchild's event arrives wrapped once per level), and every terminal event
carries its session's usage, its own and its subtree's. So the root's log alone is
enough to draw the whole tree and total it, with every child's service down::

    tree = SessionTree()
    async for event in client.stream(root_session_id):
        node = tree.add(event)  # the node the event touched; the tree is live
    assert tree.root is not None
    print(tree.root.total_usage.total_tokens)

or ``fold_events(events)`` for a log already read. The CLI's ``tree`` command and
its ``inspect`` page both use this fold (and only draw it).

Requests for input travel the same way: a session's ``input_required`` reaches the
root's log wrapped once per level, so ``tree.pending_requests()`` lists every request
waiting anywhere in the tree, each with the ``path`` to answer it by
(``AgentClient.submit_input``). A request leaves when its session logs
``input_answered`` for it, or it or a session above it ends.

A running session totals its subtree the same way, from its own log: ``ChildTotals``
keeps each direct child's latest terminal ``total_usage`` for the session's own
terminal event (``reported_usage`` reads both for the fold and for it).

- ``_fold``: ``SessionTree`` and its nodes (``TreeNode``, ``TreeUsage``, ``PendingRequest``).
- ``_totals``: ``ChildTotals``, a run's subtree usage.
"""

from __future__ import annotations

from helix_transport.tree._fold import (
    PendingRequest,
    SessionTree,
    TreeNode,
    TreeUsage,
    fold_events,
    rfc3339,
)
from helix_transport.tree._totals import (
    ChildTotals,
    reported_usage,
    token_usage,
    usage_from_proto,
)

__all__ = [
    "ChildTotals",
    "PendingRequest",
    "SessionTree",
    "TreeNode",
    "TreeUsage",
    "fold_events",
    "reported_usage",
    "rfc3339",
    "token_usage",
    "usage_from_proto",
]
