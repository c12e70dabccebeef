"""A session's limits: a deadline and a budget, set on ``Start`` and carried down the tree.

A limit travels with the work and is enforced where the work runs: a session keeps
the limits its ``Start`` gave it (stored with its record), checks them between its
steps and when its deadline passes during one, and starts each child with the smaller
of the child's own limits and what it has left itself. See ``docs/children.md``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar, Final, TypeVar

from google.protobuf.timestamp_pb2 import Timestamp

from helix_transport._exceptions import UsageError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb

DEADLINE_EXCEEDED: Final = "deadline_exceeded"
"""``limit_exceeded`` of a session its deadline ended."""
BUDGET_EXCEEDED: Final = "budget_exceeded"
"""``limit_exceeded`` of a session its budget (tokens or dollars) ended."""
LIMIT_WORDS: Final = frozenset({DEADLINE_EXCEEDED, BUDGET_EXCEEDED})

_N = TypeVar("_N", int, float)


@dataclass(frozen=True, kw_only=True)
class SessionLimits:
    """How far a session and its subtree may go; ``None`` is "no such limit"."""

    deadline: float | None = None
    """When the session must have answered, in seconds since the epoch."""
    budget_tokens: int | None = None
    """Tokens the session and its subtree may use (``total_tokens``)."""
    budget_usd: float | None = None
    """US dollars its model calls may cost, where the model's price is known."""

    none: ClassVar[SessionLimits]
    """No limit at all."""

    def __post_init__(self) -> None:
        if self.deadline is not None and not math.isfinite(self.deadline):
            raise UsageError(f"SessionLimits.deadline must be a finite time, not {self.deadline}")
        tokens = self.budget_tokens
        if tokens is not None and (isinstance(tokens, bool) or tokens < 0):
            raise UsageError(f"SessionLimits.budget_tokens must be >= 0, not {tokens!r}")
        usd = self.budget_usd
        if usd is not None and not (math.isfinite(usd) and usd >= 0):
            raise UsageError(f"SessionLimits.budget_usd must be a finite amount >= 0, not {usd}")

    @classmethod
    def within(
        cls,
        seconds: float | None = None,
        *,
        budget_tokens: int | None = None,
        budget_usd: float | None = None,
    ) -> SessionLimits:
        """Limits with a deadline ``seconds`` from now (the usual way to write one)."""
        deadline = None if seconds is None else time.time() + seconds
        return cls(deadline=deadline, budget_tokens=budget_tokens, budget_usd=budget_usd)

    @property
    def is_set(self) -> bool:
        """True when any limit is set."""
        return (self.deadline, self.budget_tokens, self.budget_usd) != (None, None, None)

    def narrowed(self, other: SessionLimits) -> SessionLimits:
        """Each limit the smaller of this one's and ``other``'s."""
        return SessionLimits(
            deadline=_smaller(self.deadline, other.deadline),
            budget_tokens=_smaller(self.budget_tokens, other.budget_tokens),
            budget_usd=_smaller(self.budget_usd, other.budget_usd),
        )

    def left(self, *, tokens: int, cost_usd: float) -> SessionLimits:
        """What is left after ``tokens`` and ``cost_usd`` were used (never below zero)."""
        return SessionLimits(
            deadline=self.deadline,
            budget_tokens=None
            if self.budget_tokens is None
            else max(0, self.budget_tokens - tokens),
            budget_usd=None if self.budget_usd is None else max(0.0, self.budget_usd - cost_usd),
        )

    def exceeded(self, *, tokens: int, cost_usd: float, now: float) -> str:
        """``DEADLINE_EXCEEDED``, ``BUDGET_EXCEEDED`` or ``""``. A budget is exceeded once
        it is used up (a budget of 0 allows nothing), a deadline once it has come."""
        if self.deadline is not None and now >= self.deadline:
            return DEADLINE_EXCEEDED
        if self.budget_tokens is not None and tokens >= self.budget_tokens:
            return BUDGET_EXCEEDED
        if self.budget_usd is not None and cost_usd >= self.budget_usd:
            return BUDGET_EXCEEDED
        return ""

    def to_proto(self) -> pb.SessionLimits:
        """As the contract's ``SessionLimits``."""
        message = pb.SessionLimits()
        if self.deadline is not None:
            seconds = math.floor(self.deadline)
            nanos = min(999_999_999, round((self.deadline - seconds) * 1e9))
            message.deadline.CopyFrom(Timestamp(seconds=seconds, nanos=nanos))
        if self.budget_tokens is not None:
            message.budget_tokens = self.budget_tokens
        if self.budget_usd is not None:
            message.budget_usd = self.budget_usd
        return message

    @classmethod
    def from_proto(cls, message: pb.SessionLimits) -> SessionLimits:
        """From the contract's ``SessionLimits`` (checked: ``UsageError`` when invalid)."""
        deadline = None
        if message.HasField("deadline"):
            deadline = message.deadline.seconds + message.deadline.nanos / 1e9
        return cls(
            deadline=deadline,
            budget_tokens=message.budget_tokens if message.HasField("budget_tokens") else None,
            budget_usd=message.budget_usd if message.HasField("budget_usd") else None,
        )


SessionLimits.none = SessionLimits()


def _smaller(a: _N | None, b: _N | None) -> _N | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
