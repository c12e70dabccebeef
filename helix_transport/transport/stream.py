"""``EventStream``: a lazy, resumable iterator over a session's events.

It talks to its service through a ``StreamSource`` (``AgentClient`` is one): a
``Stream`` call, a ``GetStatus`` call and a wait for the channel to reconnect.
"""

from __future__ import annotations

import asyncio
import operator
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from helix_transport._config import ClientConfig, RetryConfig
from helix_transport._events import is_terminal, through_terminal
from helix_transport._exceptions import (
    RemoteError,
    ResourceExhausted,
    SequenceGap,
    StreamInterrupted,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._wire import repeated_field
from helix_transport.transport._errors import RESUMABLE, to_helix_error


class StreamCall(Protocol):
    """One ``Stream`` call in flight (``grpc.aio.UnaryStreamCall`` is one)."""

    def __aiter__(self) -> AsyncIterator[Any]:
        """The responses: ``StreamResponse`` messages, or their bytes."""
        ...

    def cancel(self) -> bool:
        """End the call (a no-op once it has ended)."""
        ...


class StreamSource(Protocol):
    """What an ``EventStream`` needs of its client. Every call raises grpc's errors
    as they are: the stream decides which breaks to resume from."""

    address: str
    config: ClientConfig

    def stream_call(self, request: pb.StreamRequest, *, encoded: bool = False) -> StreamCall:
        """One ``Stream`` call: messages, or with ``encoded`` the responses' bytes."""
        ...

    async def status_call(self, session_id: str) -> pb.GetStatusResponse:
        """One ``GetStatus`` call."""
        ...

    async def reconnected(self, *, within_s: float) -> None:
        """Wait ``within_s``, or less when the channel, seen down, connects again."""
        ...


_SEQUENCE = operator.attrgetter("sequence")


def _stream_response(message: bytes) -> pb.StreamResponse | None:
    try:
        return pb.StreamResponse.FromString(message)
    except DecodeError:
        return None


class EventStream:
    """A lazy, resumable iterator over a session's events.

    Connects when iterated. Tracks ``last_sequence``; when the stream breaks
    (server restart, network drop, a replica that went away) it reconnects with
    ``from_sequence=last_sequence`` after a jittered backoff (cut short when the
    channel, seen down, connects again), until the client's
    reconnect deadline passes without progress, then raises ``StreamInterrupted``
    (never, with a ``retry`` whose deadline is ``None``: only the reader's cancellation,
    or a definitive answer such as ``NOT_FOUND``, ends an outage then).
    Events at or below ``last_sequence`` (duplicates) are dropped; a skipped
    sequence raises ``SequenceGap``. Iteration ends after the terminal event.
    """

    def __init__(
        self,
        client: StreamSource,
        session_id: str,
        *,
        from_sequence: int = 0,
        retry: RetryConfig | None = None,
    ) -> None:
        self._client = client
        self._retry = retry or client.config.reconnect
        self.session_id = session_id
        self.last_sequence = from_sequence
        self.reconnects = 0
        """How many times the stream was resumed after a break."""
        self.heartbeats = 0
        """Heartbeats received (quiet-stream signs of life; not events)."""

    def __aiter__(self) -> AsyncIterator[pb.StreamEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[pb.StreamEvent]:
        async for batch in self.batches():
            # A batch holds the next sequences in order (``_fresh``): counted, not read
            # from each event. Exact even if the reader stops at an event.
            for self.last_sequence, event in enumerate(batch, batch[0].sequence):
                yield event

    async def batches(self) -> AsyncIterator[list[pb.StreamEvent]]:
        """The same events as iterating the stream, a non-empty list at a time (as they
        arrived: one list per server message, several events when the reader is behind).

        For a consumer with per-batch work to share.
        """
        async for events, _ in self._batches(encoded=False):
            yield events

    async def encoded_batches(self) -> AsyncIterator[tuple[list[pb.StreamEvent], list[bytes]]]:
        """``batches``, each event beside its bytes as the server sent them.

        For a parent forwarding a child's events into its own log: it wraps those
        bytes instead of copying and serializing each event again.
        """
        async for pair in self._batches(encoded=True):
            yield pair

    async def _batches(
        self, *, encoded: bool
    ) -> AsyncIterator[tuple[list[pb.StreamEvent], list[bytes]]]:
        client = self._client
        retry = self._retry
        broken_since: float | None = None
        attempt = 0
        while True:
            told_to_wait = 0.0
            request = pb.StreamRequest(session_id=self.session_id, from_sequence=self.last_sequence)
            call = client.stream_call(request, encoded=encoded)
            detail = "the stream ended before the session's terminal event"
            messages = aiter(call)
            try:
                async for message in messages:
                    response = _stream_response(message) if encoded else message
                    if response is None:  # grpc's deserializer, too, gives None for junk
                        raise RemoteError(
                            "DATA_LOSS",
                            f"a Stream response of session {self.session_id!r} "
                            "is not a StreamResponse",
                        )
                    if response.HasField("heartbeat"):
                        self.heartbeats += 1
                    # Any answer shows the resumed call works: the reconnect deadline is
                    # for one outage, not for every break of a quiet session together.
                    broken_since = None
                    # Listed once: each access to a repeated message field makes a wrapper.
                    events = list(response.events)
                    fresh = self._fresh(events)
                    batch = events if fresh is None else [events[i] for i in fresh]
                    if not batch:
                        continue
                    data: list[bytes] = []
                    if encoded:
                        parts = repeated_field(message, 1)  # StreamResponse.events
                        if parts is None or len(parts) != len(events):
                            parts = [event.SerializeToString() for event in events]
                        data = parts if fresh is None else [parts[i] for i in fresh]
                    broken_since, attempt = None, 0
                    self.last_sequence = batch[-1].sequence
                    yield batch, data
                    if is_terminal(batch[-1]):
                        return
                if await self._finished():
                    return
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RESUMABLE:
                    error = to_helix_error(exc, address=client.address, session_id=self.session_id)
                    # Rate-limited or a full replica, with a hint: wait as told, then resume.
                    if not (isinstance(error, ResourceExhausted) and error.retryable):
                        raise error from exc
                    told_to_wait = error.retry_after_s or 0.0
                detail = f"{exc.code().name}: {exc.details()}"
            finally:
                call.cancel()
                await _close(messages)
            # The server ends a stream cleanly only after the terminal event, so any
            # other end (a drained server, a reset) is a break to resume from.
            now = time.monotonic()
            broken_since = broken_since or now
            if retry.expired(broken_since, now):
                raise StreamInterrupted(self.session_id, self.last_sequence, detail)
            if told_to_wait:
                await asyncio.sleep(max(retry.backoff_s(attempt), told_to_wait))
            else:
                await client.reconnected(within_s=retry.backoff_s(attempt))
            attempt += 1
            self.reconnects += 1

    def _fresh(self, events: list[pb.StreamEvent]) -> list[int] | None:
        """Where in ``events`` those after ``last_sequence`` are, up to a terminal one,
        checked for gaps; ``None`` for all of them."""
        expected = self.last_sequence + 1
        count = len(events)
        if (
            count
            and list(map(_SEQUENCE, events)) == list(range(expected, expected + count))
            and through_terminal(events) == count
        ):
            # The usual response: exactly the next ``count`` events, none ending the
            # stream before the last: checked in C loops, not a Python one per event.
            return None
        fresh: list[int] = []
        for index, event in enumerate(events):
            sequence = event.sequence
            if sequence < expected:
                continue  # already delivered before a reconnect
            if sequence != expected:
                raise SequenceGap(self.session_id, expected, sequence)
            fresh.append(index)
            expected += 1
            if is_terminal(event):
                break
        return fresh

    async def _finished(self) -> bool:
        """After a clean end: True when the reader already has the whole finished log."""
        status = await self._client.status_call(self.session_id)
        return (
            status.status not in (pb.SESSION_STATUS_UNSPECIFIED, pb.SESSION_STATUS_RUNNING)
            and status.last_sequence <= self.last_sequence
        )


async def _close(messages: AsyncIterator[Any]) -> None:
    """Close grpc's response generator now: left to the garbage collector, the event
    loop closes it in a task of its own (one a stream)."""
    aclose = getattr(messages, "aclose", None)
    if aclose is not None:
        await aclose()
