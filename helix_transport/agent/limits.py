"""A run's limits at work: what a step boundary checks, what each child is given.

The session's limits come from its record (``StartRequest.limits``, stored with the
session), so a resumed run enforces the same ones. Usage counted against a budget is
the session's own (its checkpointed model calls) plus the ``total_usage`` of its
children's terminal events in its log (``tree.ChildTotals``, read back from the log
by a resumed run): the whole subtree, each session once. A child still running is
counted when it ends; meanwhile it enforces the budget it was given itself: the
smaller of its own and what this session had left when it started.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from helix_transport._limits import BUDGET_EXCEEDED, DEADLINE_EXCEEDED, SessionLimits
from helix_transport.store import Usage
from helix_transport.tree import ChildTotals

LAST_PASS_GRACE_S: Final = 0.5
"""How long a root session whose deadline passed during a step waits for the step (its
children, asked to stop, reporting their ends) before cutting it off for its last pass."""

LAST_PASS_PROMPT: Final = {
    DEADLINE_EXCEEDED: "The deadline of this task has passed.",
    BUDGET_EXCEEDED: "The budget of this task is spent.",
}
"""The first sentence of the last pass's message, by limit."""

LAST_PASS_ASK: Final = (
    " Answer now with what you have: call the finish tool with your best final output."
    " No other tool will run."
)


def cut_off_result(limit: str) -> str:
    """What a tool call cut off by ``limit`` returns to the model."""
    what = "deadline was exceeded" if limit == DEADLINE_EXCEEDED else "budget was exceeded"
    return f"stopped before it finished: the session's {what} ({limit})"


class LimitWatch:
    """One run's limits, its usage so far, and its children's reported totals."""

    def __init__(self, limits: SessionLimits, *, is_root: bool, children: ChildTotals) -> None:
        self.limits = limits
        self.is_root = is_root
        """A root session gets one last pass once a limit is exceeded; a child ends."""
        self.children = children
        self.own = Usage()
        """The session's own usage so far (the run keeps it current)."""
        self.active = limits.is_set

    def exceeded(self) -> str:
        """``deadline_exceeded``, ``budget_exceeded`` or ``""``: the check of each step."""
        if not self.active:
            return ""
        used = self.used()
        return self.limits.exceeded(
            tokens=used.total_tokens, cost_usd=used.cost_usd, now=time.time()
        )

    def used(self) -> Usage:
        """The subtree's usage as this run knows it: its own and its ended children's."""
        return self.own + self.children.total()

    def seconds_left(self) -> float | None:
        """Until the deadline (``None``: none)."""
        deadline = self.limits.deadline
        return None if deadline is None else max(0.0, deadline - time.time())

    def for_child(self, own: SessionLimits = SessionLimits.none) -> SessionLimits:
        """A new child's limits: the smaller of its ``own`` and what this session has left."""
        if not self.active:
            return own
        used = self.used()
        left = self.limits.left(tokens=used.total_tokens, cost_usd=used.cost_usd)
        return own.narrowed(left)


@dataclass(frozen=True)
class LimitReached:
    """A step cut off by the session's deadline (``agent.loop``'s race)."""

    limit: str
