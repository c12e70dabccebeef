"""The check of ``ListSessions`` (optional): the kit's own sessions, listed as the
contract says (newest first, in pages, filtered, agreeing with ``GetStatus``)."""

from __future__ import annotations

import grpc

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance._contract import (
    LIST_SESSIONS,
    Skipped,
    require,
    status_name,
)
from helix_transport.testing.conformance._kit import Kit

MAX_PAGES = 200
"""Pages of one session each read at most (the kit's sessions, and any started since)."""


async def check_listing(kit: Kit) -> str:
    """``ListSessions``: the main session is listed, in order, page by page, and filtered."""
    declared = kit.declares(LIST_SESSIONS)
    if declared is False:
        kit.require_capability(LIST_SESSIONS)
    main = await kit.status(kit.main_session_id)
    since = pb.ListSessionsRequest(page_size=1)
    since.created_after.CopyFrom(main.created_at)  # the kit's era: a bounded listing
    try:
        first = await kit.stub.ListSessions(since, timeout=kit.rpc_timeout_s)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        require(
            declared is None,
            f"Describe lists {LIST_SESSIONS!r}, but ListSessions is UNIMPLEMENTED",
        )
        raise Skipped(
            "ListSessions is optional; the service answers UNIMPLEMENTED (and Describe "
            "lists no capabilities)"
        ) from None
    listed = await _pages(kit, since, first)
    ids = [s.session_id for s in listed]
    require(len(ids) == len(set(ids)), f"a session was listed twice across pages: {ids}")
    _newest_first(listed, "across pages of one")
    whole = pb.ListSessionsRequest()
    whole.created_after.CopyFrom(main.created_at)
    _newest_first(await _pages(kit, whole), "in pages of the default size")
    mine = [s for s in listed if s.session_id == kit.main_session_id]
    require(len(mine) == 1, f"the main session is not listed among {len(ids)} since it began")
    summary = mine[0]
    require(
        (summary.agent_type, summary.status, summary.last_sequence, summary.created_at)
        == (main.agent_type, main.status, main.last_sequence, main.created_at),
        f"its summary says {summary.agent_type!r} {status_name(summary.status)} at "
        f"{summary.last_sequence}; GetStatus says {main.agent_type!r} "
        f"{status_name(main.status)} at {main.last_sequence}",
    )
    other = next(s for s in pb.SessionStatus.values() if s not in (0, main.status))
    for statuses, expected in (([main.status], True), ([other], False)):
        filtered = pb.ListSessionsRequest(page_size=1, statuses=statuses)
        filtered.created_after.CopyFrom(main.created_at)
        found = kit.main_session_id in {s.session_id for s in await _pages(kit, filtered)}
        require(
            found is expected,
            f"statuses={[status_name(s) for s in statuses]} "
            f"{'left out' if expected else 'listed'} the main session",
        )
    await kit.expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        kit.stub.ListSessions(pb.ListSessionsRequest(page_size=-1), timeout=kit.rpc_timeout_s),
        field="page_size",
    )
    await kit.expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        kit.stub.ListSessions(
            pb.ListSessionsRequest(page_token="not-a-page-token"), timeout=kit.rpc_timeout_s
        ),
        field="page_token",
    )
    return (
        f"{len(ids)} session(s) since the main one, one per page, newest first; the "
        "status filter holds; page_size=-1 and a forged page_token INVALID_ARGUMENT"
    )


def _newest_first(listed: list[pb.SessionSummary], how: str) -> None:
    order = [(s.created_at.ToNanoseconds(), s.session_id) for s in listed]
    require(
        order == sorted(order, reverse=True),
        f"not newest first {how}: {[s.session_id for s in listed]}",
    )


async def _pages(
    kit: Kit, request: pb.ListSessionsRequest, first: pb.ListSessionsResponse | None = None
) -> list[pb.SessionSummary]:
    """Every session of ``request``'s listing, page after page."""
    page = first or await kit.stub.ListSessions(request, timeout=kit.rpc_timeout_s)
    listed = list(page.sessions)
    for _ in range(MAX_PAGES):
        if not page.next_page_token:
            return listed
        require(
            len(page.sessions) <= max(request.page_size, 1),
            f"a page of {len(page.sessions)} sessions for page_size={request.page_size}",
        )
        more = pb.ListSessionsRequest()
        more.CopyFrom(request)
        more.page_token = page.next_page_token
        page = await kit.stub.ListSessions(more, timeout=kit.rpc_timeout_s)
        listed += page.sessions
    raise Skipped(f"more than {MAX_PAGES} pages since the main session began")
