"""Retention: the optional store role that removes finished sessions, and its one rule.

A finished session *expires* once it has been finished for the retention time, and so
has its root when the root is in the same store: a tree goes together, measured from
its root's end, so a running tree never loses a child (a companion it will consult
again, a child's log it may re-read after a crash). A root in another store cannot be
seen from here: such a child is judged by its own end alone (see known limits).

Expiry removes everything keyed by the session together (record, log, checkpoint,
interrupt flag, its refs to its children, the outbox commands it owes them) and leaves
a *tombstone*: its id, when it expired and its owner, kept for a while so that a
``Stream`` or ``GetStatus`` of it can say "expired" rather than "not found".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from helix_transport._metadata import ROOT_SESSION_KEY
from helix_transport.store._records import SessionRecord


@dataclass(frozen=True, kw_only=True)
class Tombstone:
    """What is left of an expired session, until ``kept_until``."""

    session_id: str
    expired_at: float
    """When the session was removed (seconds since the epoch)."""
    kept_until: float
    """When the tombstone itself goes."""
    principal: str = ""
    """The session's owner, so only its owner learns that it expired."""
    tenant: str = ""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A finished session the sweep may remove, with the root that must be finished too."""

    session_id: str
    root_session_id: str
    """The tree's root (``session_id`` itself for a root)."""


@runtime_checkable
class RetentionStore(Protocol):
    """Optional: a backend that can remove expired sessions (all four can).

    The sweep (``store.sweep``) pages through ``finished_sessions`` and hands each page
    to ``expire_sessions``, which re-checks the rule atomically: a session continued,
    or a root continued, between the two is kept.
    """

    async def finished_sessions(
        self, *, finished_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[SessionRecord]:
        """Up to ``limit`` finished sessions with ``finished_at <= finished_before``, by
        (``finished_at``, ``session_id``), after ``after`` when given."""
        ...

    async def expire_sessions(
        self, candidates: Sequence[Candidate], *, finished_before: float, keep_tombstone_s: float
    ) -> list[str]:
        """Remove each candidate that ``expirable`` still allows, everything of it at once,
        leaving a tombstone kept ``keep_tombstone_s``; the ids removed.

        Safe to run from several replicas at once: a session is removed once, and a
        candidate already gone is skipped.
        """
        ...

    async def get_tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of an expired session, while it is kept."""
        ...

    async def drop_tombstones(self, *, kept_until: float, limit: int) -> int:
        """Remove up to ``limit`` tombstones kept until ``kept_until`` or before; how many.
        (Redis lets its keys expire on their own and answers 0.)"""
        ...


def root_of(record: SessionRecord) -> str:
    """The root of ``record``'s tree: the id its parent passed down, else its parent, else
    itself. (A child started outside the library may lack the root key.)"""
    return record.metadata.get(ROOT_SESSION_KEY) or record.parent_session_id or record.session_id


def candidate(record: SessionRecord) -> Candidate:
    """``record`` as a candidate for ``expire_sessions``."""
    return Candidate(session_id=record.session_id, root_session_id=root_of(record))


def finished_by(record: SessionRecord | None, finished_before: float) -> bool:
    """True when ``record`` is finished (not running) and ended by ``finished_before``."""
    return (
        record is not None
        and record.status.is_terminal  # not running, not suspended
        and record.finished_at is not None
        and record.finished_at <= finished_before
    )


def expirable(
    record: SessionRecord | None,
    root: SessionRecord | None,
    *,
    root_session_id: str,
    finished_before: float,
) -> bool:
    """The rule every backend applies: ``record`` finished by ``finished_before`` and, when
    its root (``root``, looked up in the same store) is there and another session,
    so is the root. Never a running session, never a child of a running root."""
    if record is None or not finished_by(record, finished_before):
        return False
    if root_session_id == record.session_id or root is None:
        return True
    return finished_by(root, finished_before)
