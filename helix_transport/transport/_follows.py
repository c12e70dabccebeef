"""Following many sessions of one service on one ``Follow`` call (a parent's children).

``SharedStreams`` is a ``StreamSource``: an ``EventStream`` over it resumes, checks
sequences and ends exactly as over ``Stream``; only the call is shared. A thousand
children followed over ``Stream`` held a thousand calls, ~60 KB of gRPC state each
between the two processes; here each is an entry in one call.

One call per set of credentials (a forwarding parent follows each caller's children
with that caller's token), opened for the first follow and closed after the last. A
call that breaks ends each of its follows as a break, which their streams resume from.
A service whose ``Describe`` does not list ``follow`` (another language's, an older
version), or that answers ``Follow`` UNIMPLEMENTED, is streamed with ``Stream``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from helix_transport._config import ClientConfig
from helix_transport._exceptions import HelixError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._rich_status import DETAILS_KEY
from helix_transport._wire import read_varint, repeated_field
from helix_transport.transport.stream import StreamSource

FOLLOW_METHOD = "/helix.agent.v1.AgentService/Follow"

_MAX_BUFFERED_BYTES = 8 << 20
"""What one follow may hold that its reader has not taken. The call's reader never
waits for a follow's reader (one that stalls would stall every follow of the call, and
a parent waiting on one child while another's reader is paused would never go on);
past this, the follow ends as a break, and its stream resumes once read again."""

_CODES = {code.value[0]: code for code in grpc.StatusCode}

Credentials = tuple[tuple[str, str], ...]


class _Unsupported:
    """The service has no ``Follow``: stream this follow with ``Stream``."""


_UNSUPPORTED = _Unsupported()
_Item = bytes | pb.FollowEnd | grpc.aio.AioRpcError | _Unsupported


class _Inbox:
    """One follow's messages, in order, until its reader takes them."""

    def __init__(self) -> None:
        self.items: deque[_Item] = deque()
        self.size = 0
        """The bytes of the responses held."""
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: _Item) -> None:
        self.items.append(item)
        if isinstance(item, bytes):
            self.size += len(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def end(self, item: _Item) -> None:
        """Drop what is held and put ``item``, the follow's last (a break: its stream
        resumes from the last event its reader took)."""
        self.items.clear()
        self.size = 0
        self.put(item)

    async def get(self) -> _Item:
        while not self.items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self.items.popleft()
        if isinstance(item, bytes):
            self.size -= len(item)
        return item


class _Client(StreamSource, Protocol):
    """What the shared streams use of their ``AgentClient``."""

    async def describe(self) -> pb.DescribeResponse:
        """The service's ``Describe``: whether it lists ``follow``."""
        ...


class SharedStreams:
    """``AgentClient``'s streams that share ``Follow`` calls (``stream(shared=True)``)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        client: _Client,
        credentials: Callable[[], Credentials],
    ) -> None:
        """``client``: the ``AgentClient`` whose ``status_call``, ``reconnected`` and,
        for a service without ``Follow``, ``stream_call`` serve these streams.
        ``credentials``: the call metadata, read in the task that follows."""
        self._client = client
        self.address = client.address
        self.config: ClientConfig = client.config
        self._follow: grpc.aio.StreamStreamMultiCallable[pb.FollowRequest, bytes]
        self._follow = channel.stream_stream(
            FOLLOW_METHOD, request_serializer=pb.FollowRequest.SerializeToString
        )
        self._credentials = credentials
        self._lines: dict[Credentials, _Line] = {}
        self._ids = itertools.count(1)
        self.supported: bool | None = None
        """Whether the service serves ``Follow``: its ``Describe`` lists ``follow`` (and it
        has not answered UNIMPLEMENTED since: a replica not upgraded yet); None until
        asked."""
        self._asking: asyncio.Task[bool] | None = None

    def stream_call(self, request: pb.StreamRequest, *, encoded: bool = False) -> _Followed:
        """One follow on the shared call, or a ``Stream`` call for a service without it."""
        return _Followed(self, request, encoded)

    async def status_call(self, session_id: str) -> pb.GetStatusResponse:
        return await self._client.status_call(session_id)

    async def reconnected(self, *, within_s: float) -> None:
        await self._client.reconnected(within_s=within_s)

    async def serves_follow(self) -> bool:
        """Whether to follow on a shared call; the service is asked once (a failed ask
        streams this follow with ``Stream`` and is asked again by the next)."""
        if self.supported is not None:
            return self.supported
        if self._asking is None:
            self._asking = asyncio.create_task(self._ask())
        return await asyncio.shield(self._asking)

    async def _ask(self) -> bool:
        try:
            described = await self._client.describe()
        except HelixError:
            return False
        else:
            self.supported = "follow" in described.capabilities
            return self.supported
        finally:
            self._asking = None

    def _line(self, credentials: Credentials) -> _Line:
        line = self._lines.get(credentials)
        if line is None or line.closed:
            line = self._lines[credentials] = _Line(self, credentials)
        return line

    def close(self) -> None:
        """Cancel every open call (the client is closing)."""
        lines, self._lines = list(self._lines.values()), {}
        for line in lines:
            line.cancel()


class _Line:
    """One ``Follow`` call: its follows, each with the messages its reader has not
    taken yet."""

    def __init__(self, owner: SharedStreams, credentials: Credentials) -> None:
        self._owner = owner
        self._requests: asyncio.Queue[pb.FollowRequest | None] = asyncio.Queue()
        self.follows: dict[int, _Inbox] = {}
        self.closed = False
        self._call = owner._follow(self._send(), metadata=credentials or None)
        self._reader = asyncio.create_task(self._read())

    async def _send(self) -> AsyncIterator[pb.FollowRequest]:
        while (request := await self._requests.get()) is not None:
            yield request

    def add(self, follow_id: int, request: pb.StreamRequest) -> _Inbox:
        inbox = self.follows[follow_id] = _Inbox()
        self._requests.put_nowait(pb.FollowRequest(follow_id=follow_id, stream=request))
        return inbox

    def remove(self, follow_id: int, *, stop: bool) -> None:
        """Forget a follow (with ``stop``, ask the server to stop it too); the call
        closes with its last follow."""
        if self.follows.pop(follow_id, None) is None or self.closed:
            return
        if stop:
            self._requests.put_nowait(pb.FollowRequest(follow_id=follow_id, stop=True))
        if not self.follows:
            self.closed = True
            self._requests.put_nowait(None)  # the server ends the call once all ended

    def cancel(self) -> None:
        self.closed = True
        self._call.cancel()

    async def _read(self) -> None:
        error: grpc.aio.AioRpcError | None = None
        try:
            async for response in self._call:
                behind: dict[int, bool] = {}  # each follow's, as this response began
                for follow_id, body in _messages(response):
                    self._deliver(follow_id, body, behind)
        except grpc.aio.AioRpcError as exc:
            error = exc
        except ValueError:
            error = _broken(grpc.StatusCode.DATA_LOSS, "a Follow response did not parse")
        except Exception as exc:  # a channel interceptor's, say: never leave follows waiting
            error = _broken(grpc.StatusCode.UNKNOWN, f"the Follow call failed: {exc!r}")
        finally:
            self.closed = True
        self._end(error or _broken(grpc.StatusCode.UNAVAILABLE, "the Follow call ended"))

    def _deliver(self, follow_id: int, body: bytes | pb.FollowEnd, behind: dict[int, bool]) -> None:
        """Hand one message to its follow, unless its reader holds too much from earlier
        responses already (a response always fits whole, or a resumed follow could
        never catch up)."""
        inbox = self.follows.get(follow_id)
        if inbox is None:  # stopped, or never ours
            return
        if behind.setdefault(follow_id, inbox.size > _MAX_BUFFERED_BYTES):
            self.remove(follow_id, stop=True)
            inbox.end(_broken(grpc.StatusCode.UNAVAILABLE, "the reader fell behind"))
        else:
            inbox.put(body)

    def _end(self, error: grpc.aio.AioRpcError) -> None:
        """Tell each open follow that the call broke (what it buffered is dropped: its
        stream resumes from the last event its reader took)."""
        item: _Item = error
        if error.code() is grpc.StatusCode.UNIMPLEMENTED:
            self._owner.supported = False
            item = _UNSUPPORTED
        for inbox in self.follows.values():
            inbox.end(item)


class _Followed:
    """One follow: a ``StreamCall`` whose responses come over a shared call."""

    def __init__(self, owner: SharedStreams, request: pb.StreamRequest, encoded: bool) -> None:
        self._owner = owner
        self._request = request
        self._encoded = encoded
        self._line: _Line | None = None
        self._id = 0
        self._stream: Any = None
        """The ``Stream`` call of a service without ``Follow``."""

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Any]:
        owner = self._owner
        try:
            if await owner.serves_follow():
                line = self._line = owner._line(owner._credentials())
                self._id = next(owner._ids)
                inbox = line.add(self._id, self._request)
                while isinstance(item := await inbox.get(), bytes):
                    yield item if self._encoded else pb.StreamResponse.FromString(item)
                self._line = None
                line.remove(self._id, stop=False)
                if isinstance(item, pb.FollowEnd):
                    if item.code:
                        raise _error_of(item)
                    return
                if isinstance(item, grpc.aio.AioRpcError):
                    raise item
            self._stream = owner._client.stream_call(self._request, encoded=self._encoded)
            async for message in self._stream:
                yield message
        finally:
            self.cancel()

    def cancel(self) -> bool:
        if self._stream is not None:
            return bool(self._stream.cancel())
        line, self._line = self._line, None
        if line is None:
            return False
        line.remove(self._id, stop=True)
        return True


def _messages(response: bytes) -> list[tuple[int, bytes | pb.FollowEnd]]:
    """A ``FollowResponse``'s messages: each one's follow id, and its ``StreamResponse``
    bytes or its end.

    Raises:
        ValueError: the bytes are not such a message.
    """
    entries = repeated_field(response, 1)
    if not entries:
        raise ValueError("not a FollowResponse")
    return [_split(entry) for entry in entries]


def _split(message: bytes) -> tuple[int, bytes | pb.FollowEnd]:
    """A ``FollowMessage``'s follow id, and its ``StreamResponse`` bytes or its end.

    Raises:
        ValueError: the bytes are not such a message.
    """
    follow_id, body, end = 0, b"", None
    index, size = 0, len(message)
    try:
        while index < size:
            key, index = read_varint(message, index)
            if key == 0x08:
                follow_id, index = read_varint(message, index)
            elif key & 7 == 2:
                length, index = read_varint(message, index)
                value, index = message[index : index + length], index + length
                if key == 0x12:
                    body = value
                elif key == 0x1A:
                    end = pb.FollowEnd.FromString(value)  # DecodeError: not ours
            elif key & 7 == 0:
                _, index = read_varint(message, index)
            else:
                raise ValueError(f"unexpected field key {key}")
    except (IndexError, DecodeError) as exc:
        raise ValueError("truncated") from exc
    if index != size or not follow_id:
        raise ValueError("not a FollowMessage")
    return follow_id, body if end is None else end


def _error_of(end: pb.FollowEnd) -> grpc.aio.AioRpcError:
    """A follow's end as the error its ``Stream`` call would have raised."""
    trailing = grpc.aio.Metadata((DETAILS_KEY, end.details)) if end.details else grpc.aio.Metadata()
    code = _CODES.get(end.code, grpc.StatusCode.UNKNOWN)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details=end.message)


def _broken(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)
