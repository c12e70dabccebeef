"""``ListSessions``: the caller's sessions on this service, newest first, in pages.

The request's filters become a ``SessionQuery`` scoped to the caller (principal and
tenant) and to this service's agent type (a session of another type on a shared
store is not found here, so it is not listed either). A page token is the position
where the page ended, as the store's key (the caller's own namespace), with a digest
of the filters it was issued for: paging on with other filters is refused rather
than answered with a mix of two listings.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import math
import re

from google.protobuf.timestamp_pb2 import Timestamp

from helix_transport._events import SessionStatus
from helix_transport._exceptions import InvalidArgument
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.server._identity import Principal
from helix_transport.server._ownership import caller_id, storage_id
from helix_transport.store import SessionIndex, SessionQuery, SessionRecord

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
"""A larger ``page_size`` is served as this (the store's ``LIST_LIMIT``)."""
MAX_TOKEN = 2048
"""Longer than any token this service issues."""
_AGENT_TYPE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
# Timestamp's range: 0001-01-01 to 9999-12-31, as google.protobuf defines it.
_MIN_SECONDS, _MAX_SECONDS = -62_135_596_800, 253_402_300_799


async def list_sessions(
    index: SessionIndex, request: pb.ListSessionsRequest, *, agent_type: str, caller: Principal
) -> pb.ListSessionsResponse:
    """One page of ``caller``'s sessions of ``agent_type``, filtered by ``request``.

    Raises:
        InvalidArgument: naming the field: a negative ``page_size``, a ``page_token``
            not issued for these filters, an unknown status, a malformed agent type
            or timestamp.
    """
    query = _query(request, caller)
    size = page_size(request.page_size)
    filters = _digest(request)
    after = _position(request.page_token, filters) if request.page_token else None
    if query.agent_type and query.agent_type != agent_type:
        return pb.ListSessionsResponse()  # this service runs no session of that type
    query = dataclasses.replace(query, agent_type=agent_type, after=after)
    page = await index.query_sessions(query, limit=size)
    response = pb.ListSessionsResponse(
        sessions=[summary(r) for r in page.records if _in_namespace(r, caller)]
    )
    if page.next_after is not None:
        response.next_page_token = _token(page.next_after, filters)
    return response


def summary(record: SessionRecord) -> pb.SessionSummary:
    """``record`` as listed, under the id its caller knows."""
    message = pb.SessionSummary(
        session_id=caller_id(record.session_id),
        agent_type=record.agent_type,
        status=record.status.to_proto(),
        parent_session_id=record.parent_session_id,
        last_sequence=record.last_sequence,
    )
    message.created_at.FromNanoseconds(int(record.created_at * 1e9))
    message.updated_at.FromNanoseconds(int(record.updated_at * 1e9))
    if record.finished_at is not None and record.status.is_terminal:  # not mid-turn
        message.finished_at.FromNanoseconds(int(record.finished_at * 1e9))
    return message


def page_size(value: int) -> int:
    """Sessions per page: the default for 0, at most ``MAX_PAGE_SIZE``."""
    if value < 0:
        raise InvalidArgument("page_size", "must not be negative (0 for the default)")
    return min(value or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _query(request: pb.ListSessionsRequest, caller: Principal) -> SessionQuery:
    statuses = set()
    for index, value in enumerate(request.statuses):
        try:
            statuses.add(SessionStatus.from_proto(value))
        except ValueError:
            raise InvalidArgument(
                f"statuses[{index}]", f"{value} is not a session status (RUNNING..TERMINATED)"
            ) from None
    if request.agent_type and not _AGENT_TYPE.fullmatch(request.agent_type):
        raise InvalidArgument("agent_type", "not an agent type ([a-z][a-z0-9_-]{0,62})")
    return SessionQuery(
        principal=caller.name,
        tenant=caller.tenant,
        statuses=frozenset(statuses),
        agent_type=request.agent_type,
        created_after=(
            _time(request.created_after, "created_after")
            if request.HasField("created_after")
            else None
        ),
        created_before=(
            _time(request.created_before, "created_before")
            if request.HasField("created_before")
            else None
        ),
        roots_only=request.roots_only,
    )


def _time(value: Timestamp, name: str) -> float:
    if not _MIN_SECONDS <= value.seconds <= _MAX_SECONDS or not 0 <= value.nanos <= 999_999_999:
        raise InvalidArgument(name, "not a valid Timestamp (years 1 to 9999, nanos 0..999999999)")
    return reported_at_or_after(value.seconds * 1_000_000_000 + value.nanos)


def reported_at_or_after(nanos: int) -> float:
    """The smallest stored time (seconds, a float) reported as ``nanos`` or later.

    Times are stored as floats and reported as ``int(t * 1e9)`` nanoseconds; comparing
    a bound as ``seconds + nanos / 1e9`` would be off by a rounding now and then, and a
    caller passing a session's own ``created_at`` back as ``created_after`` could miss
    that very session. So ``t >= reported_at_or_after(n)`` exactly when ``t`` is
    reported at ``n`` or later (the reported time only grows with ``t``).
    """
    bound = nanos / 1e9
    while int(bound * 1e9) >= nanos:
        bound = math.nextafter(bound, -math.inf)
    while int(bound * 1e9) < nanos:
        bound = math.nextafter(bound, math.inf)
    return bound


def _in_namespace(record: SessionRecord, caller: Principal) -> bool:
    """False for a session stored before namespaces under a bare id by an authenticated
    owner: ``GetStatus`` cannot find it by that id, so it is not listed."""
    return storage_id(caller, caller_id(record.session_id)) == record.session_id


def _digest(request: pb.ListSessionsRequest) -> str:
    """What a token was issued for: the request's filters."""
    filters = pb.ListSessionsRequest()
    filters.CopyFrom(request)
    filters.ClearField("page_token")
    filters.ClearField("page_size")  # a reader may change its page size as it goes
    statuses = sorted(set(filters.statuses))
    del filters.statuses[:]
    filters.statuses.extend(statuses)
    return hashlib.sha256(filters.SerializeToString(deterministic=True)).hexdigest()[:16]


def _token(position: tuple[float, str], filters: str) -> str:
    text = json.dumps([1, float(position[0]).hex(), position[1], filters], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _position(token: str, filters: str) -> tuple[float, str]:
    if len(token) > MAX_TOKEN:
        raise InvalidArgument("page_token", "not a page token of this service (too long)")
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        version, created_at, key, issued_for = json.loads(text)
        position = (float.fromhex(created_at), key)
    except (ValueError, TypeError, UnicodeDecodeError, binascii.Error):
        raise InvalidArgument("page_token", "not a page token of this service") from None
    if version != 1 or not isinstance(key, str) or not math.isfinite(position[0]):
        raise InvalidArgument("page_token", "not a page token of this service")
    if issued_for != filters:
        raise InvalidArgument(
            "page_token", "issued for other filters: send the filters of the first page"
        )
    return position
