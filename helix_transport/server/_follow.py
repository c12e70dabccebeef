"""``Follow``: many ``Stream``s of one service on one call, each tagged with its follow id.

A parent with a thousand children on one service held a thousand ``Stream`` calls, each
~60 KB of gRPC state between the two processes; followed here, each is one task and
its reader (~5 KB). Every follow is what ``Stream`` would send for its request, then
one ``FollowEnd``. The follows share one bounded queue to the call, so a reader that
does not read holds them all back (gRPC's flow control, as for one stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from helix_transport import _rich_status
from helix_transport._exceptions import InvalidArgument, ResourceExhausted
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._wire import varint

FOLLOW_METHOD = "/helix.agent.v1.AgentService/Follow"

MAX_FOLLOWS = 10_000
"""Open follows in one call: one more ends at once with RESOURCE_EXHAUSTED."""

_QUEUED = 256
"""Messages waiting for the call's writer before a follow waits to add its next."""

_MESSAGE_KEY = b"\x0a"
"""``FollowResponse.messages``: field 1, length-delimited (repeated)."""
_ID_KEY = b"\x08"
"""``FollowMessage.follow_id``: field 1, varint."""
_RESPONSE_KEY = b"\x12"
"""``FollowMessage.response``: field 2, length-delimited."""
_END_KEY = b"\x1a"
"""``FollowMessage.end``: field 3, length-delimited."""

StreamOf = Callable[[pb.StreamRequest], AsyncIterator[pb.StreamResponse | bytes]]
"""What ``Stream`` answers a request: its responses (pre-encoded, or messages)."""
Charge = Callable[[], None]
"""Charges one follow to the caller's rate limit; raises ``ResourceExhausted``."""
Ended = Callable[[Exception], tuple[int, str, bytes]]
"""What a caller is told of a follow's error: code, message, rich details."""

_Item = bytes | BaseException | None
"""A message (one ``FollowMessage``, as ``FollowResponse`` bytes), the call's error, or
its end."""


class _NotReady:
    """No message waits in the queue."""


_NOT_READY = _NotReady()


async def follow_responses(
    requests: AsyncIterator[pb.FollowRequest],
    stream: StreamOf,
    *,
    charge: Charge,
    ended: Ended,
    response_bytes: int,
) -> AsyncIterator[bytes]:
    """The call's responses, encoded, for the follows ``requests`` add and stop.

    Each response carries every message ready when it is sent, up to about
    ``response_bytes``: one call writes its messages one at a time, so a reader that
    is behind (a parent whose thousand children all speak at once) gets them in few
    writes, not one each. Ends once the caller has sent its last request and every
    follow has ended; a bad request (a follow id of 0, one already open) ends the call
    with its error.
    """
    call = _Call(stream, charge, ended)
    reading = asyncio.create_task(call.read(requests))
    out = call.out
    try:
        item: _Item | _NotReady = await out.get()
        while isinstance(item, bytes):
            parts, size = [item], len(item)
            item = _NOT_READY
            while not out.empty():
                item = out.get_nowait()
                if not isinstance(item, bytes) or size + len(item) > response_bytes:
                    break  # the end, an error, or the next response's first message
                parts.append(item)
                size += len(item)
                item = _NOT_READY
            yield b"".join(parts)
            if isinstance(item, _NotReady):
                item = await out.get()
        if isinstance(item, BaseException):
            raise item
    finally:
        reading.cancel()
        for task in list(call.follows.values()):
            task.cancel()


class _Call:
    """One ``Follow`` call: its open follows and the queue they answer into."""

    def __init__(self, stream: StreamOf, charge: Charge, ended: Ended) -> None:
        self.stream = stream
        self.charge = charge
        self.ended = ended
        self.out: asyncio.Queue[_Item] = asyncio.Queue(_QUEUED)
        self.follows: dict[int, asyncio.Task[None]] = {}
        self.reading = True

    async def read(self, requests: AsyncIterator[pb.FollowRequest]) -> None:
        try:
            async for request in requests:
                self._take(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an undecodable request, a broken call
            await self.out.put(exc)
            return
        self.reading = False
        if not self.follows:
            await self.out.put(None)

    def _take(self, request: pb.FollowRequest) -> None:
        follow_id = request.follow_id
        if not follow_id:
            raise InvalidArgument("follow_id", "required (not 0)")
        if request.WhichOneof("change") != "stream":  # stop (or nothing: the same)
            task = self.follows.pop(follow_id, None)
            if task is not None:
                task.cancel()
            return
        if follow_id in self.follows:
            raise InvalidArgument("follow_id", f"{follow_id} is already open in this call")
        self.follows[follow_id] = asyncio.create_task(self._follow(follow_id, request.stream))

    async def _follow(self, follow_id: int, request: pb.StreamRequest) -> None:
        head = _ID_KEY + varint(follow_id)
        end = pb.FollowEnd()  # OK: after the terminal event
        try:
            if len(self.follows) > MAX_FOLLOWS:
                raise ResourceExhausted(
                    "follows", f"a Follow call follows at most {MAX_FOLLOWS:,} sessions at once"
                )
            self.charge()
            async for response in self.stream(request):
                data = response if isinstance(response, bytes) else response.SerializeToString()
                await self.out.put(_message(head, _RESPONSE_KEY, data))
        except Exception as exc:
            code, message, details = self.ended(exc)
            end = pb.FollowEnd(code=code, message=message, details=details)
        if self.follows.get(follow_id) is not asyncio.current_task():
            return  # stopped meanwhile: nothing more is sent for it
        await self.out.put(_message(head, _END_KEY, end.SerializeToString()))
        self.follows.pop(follow_id, None)
        if not self.reading and not self.follows:
            await self.out.put(None)


def _message(head: bytes, key: bytes, data: bytes) -> bytes:
    """A ``FollowMessage`` (``head``: its follow id's field) as one entry of a
    ``FollowResponse``: entries join into a response as they are."""
    size = varint(len(data))
    inner = len(head) + len(key) + len(size) + len(data)
    return b"".join((_MESSAGE_KEY, varint(inner), head, key, size, data))


def details_of(metadata: _rich_status.Metadata) -> bytes:
    """The serialized google.rpc.Status in a trailer, or b""."""
    for key, value in metadata:
        if key == _rich_status.DETAILS_KEY and isinstance(value, bytes):
            return value
    return b""
