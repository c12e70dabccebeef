"""The hub: in-process fan-out of a session's freshly appended events to its local
readers, from a bounded tail kept as bytes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from helix_transport._events import is_terminal
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent


@dataclass(frozen=True, slots=True)
class Batch:
    """Consecutive events as ``follow`` yields them, serialized; none for a heartbeat cue."""

    encoded: list[bytes]
    last_sequence: int = 0
    """The sequence of the last event (0 when there is none)."""
    terminal: bool = False
    """The last event ends the session's stream."""

    def decode(self) -> list[StreamEvent]:
        """The events as messages, parsed on each call (serving a stream needs only bytes)."""
        return [StreamEvent.FromString(data) for data in self.encoded]


@dataclass
class _Tail:
    # Bytes, not messages: a message object is tracked by the garbage collector, and
    # 500 sessions' tails of messages made each full collection traverse up to 100k of them.
    waiter: asyncio.Future[None]
    encoded: list[bytes] = field(default_factory=list)
    """The cached events serialized, oldest first."""
    first: int = 0
    """The sequence of ``encoded[0]``."""
    nbytes: int = 0
    ended: bool = False
    """It ends with a terminal event: kept only for the readers still draining it."""
    terminals: list[int] = field(default_factory=list)
    """Sequences of its terminal events: a continued session's next turn follows one."""
    writing: bool = False
    """A local writer fills it (see ``EventHub.expect``)."""

    @property
    def last_sequence(self) -> int:
        return self.first + len(self.encoded) - 1


@dataclass(eq=False)  # each reader is itself: two at one sequence are not the same reader
class Reader:
    """One local reader of a session."""

    last_sequence: int = 0
    """The sequence of the last event it was given."""


def _over(tail: _Tail, size: int, nbytes: int, limit: int) -> tuple[int, int]:
    """How many of the oldest events to drop, at most ``limit``, for ``tail`` to be
    within ``size`` events and ``nbytes`` bytes (never its newest one), and the bytes
    left after that."""
    encoded = tail.encoded
    limit = min(limit, len(encoded) - 1)
    drop = min(max(len(encoded) - size, 0), limit)
    left = tail.nbytes - sum(map(len, encoded[:drop]))
    while left > nbytes and drop < limit:  # over in bytes: walk what must go
        left -= len(encoded[drop])
        drop += 1
    return drop, left


class EventHub:
    """In-process fan-out of freshly appended events, with a bounded recent tail.

    A session's tail lives while its local writer runs or a reader waits on it. On
    the terminal event it is dropped at once if nobody reads it, else when its last
    reader leaves (readers woken by the end are served from memory, late readers
    replay from the store); it is also dropped when the writer stops without a
    terminal event, and when the last reader of a writer-less session leaves.

    The tail is bounded in bytes as well as events. Events a local reader has not
    been given yet are kept up to ``reader_tail_size``/``reader_tail_bytes``, so a
    reader that falls behind a burst (a parent forwarding a child's 10,000 events)
    is served from memory instead of going back to the store; past what every
    reader has, the tail keeps ``tail_size``/``tail_bytes``. A session of large
    events still caches at most the larger byte bound (plus its newest event).
    """

    def __init__(
        self,
        *,
        tail_size: int = 4_096,
        tail_bytes: int = 256 << 10,
        reader_tail_size: int = 16_384,
        reader_tail_bytes: int = 2 << 20,
    ) -> None:
        self._tails: dict[str, _Tail] = {}
        self._readers: dict[str, list[Reader]] = {}
        self._tail_size = tail_size
        self._tail_bytes = tail_bytes
        self._reader_tail_size = max(reader_tail_size, tail_size)
        self._reader_tail_bytes = max(reader_tail_bytes, tail_bytes)

    def _tail(self, session_id: str) -> _Tail:
        tail = self._tails.get(session_id)
        if tail is None:
            tail = _Tail(waiter=asyncio.get_running_loop().create_future())
            self._tails[session_id] = tail
        return tail

    def publish(self, session_id: str, events: list[StreamEvent]) -> None:
        """Record newly appended events and wake every waiting reader."""
        self.publish_encoded(
            session_id,
            events[0].sequence,
            [event.SerializeToString() for event in events],
            terminal=is_terminal(events[-1]),
        )

    def publish_encoded(
        self, session_id: str, first: int, encoded: list[bytes], *, terminal: bool
    ) -> None:
        """``publish`` for events as bytes: ``first`` is the sequence of ``encoded[0]``,
        ``terminal`` whether the last one ends the stream."""
        tail = self._tail(session_id)
        if tail.encoded and tail.last_sequence + 1 != first:
            # Another writer took over: the cached tail is no longer contiguous.
            tail.encoded, tail.nbytes, tail.terminals = [], 0, []
        if not tail.encoded:
            tail.first = first
        tail.encoded.extend(encoded)
        tail.nbytes += sum(map(len, encoded))
        if terminal:
            tail.terminals.append(tail.last_sequence)
        self._trim(tail, self._readers.get(session_id))
        waiter, tail.waiter = tail.waiter, asyncio.get_running_loop().create_future()
        waiter.set_result(None)
        tail.ended = terminal  # a continued session's new turn un-ends it
        if tail.ended and not self._readers.get(session_id):
            self.forget(session_id)

    def _trim(self, tail: _Tail, readers: list[Reader] | None) -> None:
        """Drop the oldest events past the bounds, keeping the newest one always."""
        count = len(tail.encoded)
        if count <= self._tail_size and tail.nbytes <= self._tail_bytes:
            return  # the usual case: nothing to drop, no per-reader work
        limit = count
        if readers:
            # Events after the slowest reader's sequence are still owed to it: those are
            # dropped only past the larger bounds.
            owed_from = max(0, min(r.last_sequence for r in readers) + 1 - tail.first)
            if owed_from < count:
                hard, _ = _over(tail, self._reader_tail_size, self._reader_tail_bytes, count)
                limit = max(owed_from, hard)
        drop, tail.nbytes = _over(tail, self._tail_size, self._tail_bytes, limit)
        if drop:
            del tail.encoded[:drop]
            tail.first += drop
            if tail.terminals and tail.terminals[0] < tail.first:
                tail.terminals = [n for n in tail.terminals if n >= tail.first]

    def expect(self, session_id: str, first: int) -> None:
        """A local writer starts: it publishes from sequence ``first`` on.

        Until it does, a reader that already has everything before ``first`` is told
        to wait for the publish (``since`` gives an empty batch), not sent to the store.
        """
        tail = self._tail(session_id)
        tail.writing = True
        if not tail.encoded:
            tail.first = first

    def forget(self, session_id: str) -> None:
        """The local writer stopped: drop the tail, waking anyone still waiting on it.

        An ended tail stays for the readers still draining it (the last one drops it).
        """
        tail = self._tails.get(session_id)
        if tail is None or (tail.ended and self._readers.get(session_id)):
            return
        del self._tails[session_id]
        if not tail.waiter.done():
            tail.waiter.set_result(None)

    def since(self, session_id: str, from_sequence: int, limit: int) -> Batch | None:
        """Cached events with ``sequence > from_sequence``; ``None`` when the cache
        can't tell."""
        tail = self._tails.get(session_id)
        if tail is None:
            return None
        if not tail.encoded:  # caught up with a local writer that has yet to publish?
            return Batch([]) if tail.writing and from_sequence + 1 == tail.first else None
        if from_sequence + 1 < tail.first or (tail.ended and from_sequence >= tail.last_sequence):
            # Before the tail, or past a session's end: the store says which (at once,
            # where waiting on an ended tail would last a poll interval).
            return None
        start = from_sequence + 1 - tail.first
        stop = start + limit
        end = None  # where the reader's stream ends: the first terminal event after it
        if tail.terminals:  # none while the session runs (the usual case: no loop)
            end = next((n for n in tail.terminals if n > from_sequence), None)
            if end is not None:
                stop = min(stop, end + 1 - tail.first)
        encoded = tail.encoded[start:stop]
        last_sequence = from_sequence + len(encoded)
        return Batch(encoded, last_sequence, last_sequence == end)

    def waiter(self, session_id: str) -> asyncio.Future[None]:
        """A future resolved at the session's next ``publish``."""
        return self._tail(session_id).waiter

    def tails(self) -> int:
        """Sessions with a cached tail (for tests and metrics)."""
        return len(self._tails)

    @contextlib.contextmanager
    def reading(self, session_id: str, *, from_sequence: int = 0) -> Iterator[Reader]:
        """Register a reader; it moves its ``last_sequence`` as it is given events.

        The last reader out drops a tail no local writer fills.
        """
        reader = Reader(last_sequence=from_sequence)
        self._readers.setdefault(session_id, []).append(reader)
        try:
            yield reader
        finally:
            readers = self._readers[session_id]
            readers.remove(reader)
            if not readers:
                del self._readers[session_id]
                tail = self._tails.get(session_id)
                if tail is not None and (tail.ended or not (tail.encoded or tail.writing)):
                    del self._tails[session_id]
