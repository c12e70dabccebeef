"""``ListSessions`` requests from keyword filters, and the pages after the first."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime

from helix_transport._events import SessionStatus
from helix_transport._exceptions import UsageError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb


def list_request(
    *,
    statuses: Sequence[SessionStatus] = (),
    agent_type: str = "",
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    roots_only: bool = False,
    page_size: int = 0,
    page_token: str = "",
) -> pb.ListSessionsRequest:
    """The ``ListSessionsRequest`` for these filters.

    Raises:
        UsageError: a naive ``datetime`` (its time zone would be a guess).
    """
    request = pb.ListSessionsRequest(
        page_size=page_size,
        page_token=page_token,
        statuses=[SessionStatus(status).to_proto() for status in statuses],
        agent_type=agent_type,
        roots_only=roots_only,
    )
    for name, value in (("created_after", created_after), ("created_before", created_before)):
        if value is None:
            continue
        if value.tzinfo is None:
            raise UsageError(f"{name} must be an aware datetime (e.g. tzinfo=timezone.utc)")
        getattr(request, name).FromDatetime(value)
    return request


async def summaries(
    list_page: Callable[[str], Awaitable[pb.ListSessionsResponse]],
    *,
    limit: int | None = None,
) -> AsyncIterator[pb.SessionSummary]:
    """Every session ``list_page(page_token)`` pages through, at most ``limit``."""
    if limit is not None and limit < 0:
        raise UsageError(f"limit must not be negative, not {limit}")
    given = 0
    token = ""
    while limit is None or given < limit:
        page = await list_page(token)
        for summary in page.sessions:
            if limit is not None and given >= limit:
                return
            given += 1
            yield summary
        token = page.next_page_token
        if not token:
            return
