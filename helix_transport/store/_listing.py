"""Listing one owner's sessions, newest first, a page at a time (``SessionIndex``).

The order is ``created_at`` descending, then ``session_id`` descending (by code point,
the same on every backend). A page ends at a position, the (``created_at``,
``session_id``) of the last session examined; the next page starts strictly after it
(keyset paging), so sessions created meanwhile, all newer than the first page, never
shift a later page.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from helix_transport._events import SessionStatus
from helix_transport._exceptions import UsageError
from helix_transport.store._records import SessionRecord

LIST_LIMIT = 500
"""The most sessions one ``query_sessions`` returns."""

UNOWNED_PRINCIPAL = "anonymous"
"""The principal a record without one (written before sessions had owners) is listed
under, as the server's ownership check counts it."""

Position = tuple[float, str]
"""(``created_at``, ``session_id``): where a page ended."""


def listed_principal(record: SessionRecord) -> str:
    """The principal ``record`` is listed under."""
    return record.principal or UNOWNED_PRINCIPAL


def position(record: SessionRecord) -> Position:
    """``record``'s place in the listing order (larger is listed first)."""
    return (record.created_at, record.session_id)


@dataclass(frozen=True, kw_only=True)
class SessionQuery:
    """Which sessions ``SessionIndex.query_sessions`` lists: one owner's, filtered
    (the filters combine with AND)."""

    principal: str
    """The owner: only sessions this principal started (see ``listed_principal``)."""
    tenant: str = ""
    """... of this tenant."""
    statuses: frozenset[SessionStatus] = field(default_factory=frozenset)
    """Only sessions in one of these; empty for any."""
    agent_type: str = ""
    """Only sessions of this agent type; empty for any."""
    created_after: float | None = None
    """Only sessions created at or after this time."""
    created_before: float | None = None
    """Only sessions created before this time."""
    roots_only: bool = False
    """Only sessions without a parent."""
    after: Position | None = None
    """Only sessions listed after this position (the previous page's ``next_after``)."""

    def __post_init__(self) -> None:
        if not self.principal:
            raise UsageError("SessionQuery.principal must not be empty")

    def owns(self, record: SessionRecord) -> bool:
        """True when ``record`` is this query's owner's."""
        return listed_principal(record) == self.principal and record.tenant == self.tenant

    def matches(self, record: SessionRecord) -> bool:
        """True when ``record`` is listed by this query (owner, filters and position)."""
        return (
            self.owns(record)
            and (not self.statuses or record.status in self.statuses)
            and (not self.agent_type or record.agent_type == self.agent_type)
            and (self.created_after is None or record.created_at >= self.created_after)
            and (self.created_before is None or record.created_at < self.created_before)
            and not (self.roots_only and record.parent_session_id)
            and (self.after is None or position(record) < self.after)
        )


@dataclass(frozen=True, kw_only=True)
class SessionPage:
    """One page of a listing."""

    records: list[SessionRecord]
    """At most the limit asked for, newest first."""
    next_after: Position | None
    """Where the next page starts (``SessionQuery.after``); ``None``: nothing follows.
    A page may hold fewer records than asked for while more follow (Redis stops after
    examining a bounded number of sessions): only ``None`` ends the listing."""


def page_of(rows: list[SessionRecord], limit: int) -> SessionPage:
    """The page for ``rows``, the first ``limit + 1`` matches in order: the extra one
    only says that more follow."""
    records = rows[:limit]
    more = len(rows) > limit and bool(records)
    return SessionPage(records=records, next_after=position(records[-1]) if more else None)


def clamp(limit: int) -> int:
    """``limit`` within 0..``LIST_LIMIT``."""
    return max(min(limit, LIST_LIMIT), 0)


def sortable_time(value: float) -> str:
    """16 hex digits that sort, as text, as ``value`` sorts as a float (the IEEE bits,
    with the sign bit flipped for positives and every bit for negatives)."""
    (bits,) = struct.unpack(">Q", struct.pack(">d", value))
    bits = bits ^ 0xFFFF_FFFF_FFFF_FFFF if bits >> 63 else bits | (1 << 63)
    return f"{bits:016x}"


def time_from_sortable(text: str) -> float:
    """``sortable_time``'s inverse."""
    bits = int(text, 16)
    bits = bits & ~(1 << 63) if bits >> 63 else bits ^ 0xFFFF_FFFF_FFFF_FFFF
    (value,) = struct.unpack(">d", struct.pack(">Q", bits))
    return float(value)
