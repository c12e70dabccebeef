"""The event log: appending a session's events and following them live.

Writers append through a ``SessionWriter``, which *group-commits*: events emitted
while a store write is in flight are appended together by the next write, so a
fast producer costs one store round trip per batch, not per event. An event is
published to readers only after the store has assigned its sequence. The writer
serializes each event once: the store, the hub and the ``Stream`` responses all
use those bytes.

Readers ``follow`` a session: replay from the store, then tail live events from
the in-process ``EventHub`` (no store round trip), falling back to polling the
store for writers in other processes. Readers get batches of consecutive events
and never see a gap or a repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import operator
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from helix_transport._exceptions import SessionNotFound
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport._wire import sequenced_all
from helix_transport.store import READ_LIMIT, Checkpoint, SessionUpdate, Store
from helix_transport.store._base import EventNotifier

TERMINAL_PAYLOADS = frozenset({"completed", "failed", "interrupted", "terminated"})


def is_terminal(event: StreamEvent) -> bool:
    """True for the events that end a session's stream."""
    return event.WhichOneof("payload") in TERMINAL_PAYLOADS


_PAYLOAD = operator.methodcaller("WhichOneof", "payload")


def through_terminal(events: Sequence[StreamEvent]) -> int:
    """How many of ``events`` one stream delivers: all, or up to and with the first
    terminal one (a continued session's log goes on after it with the next turn)."""
    if TERMINAL_PAYLOADS.isdisjoint(map(_PAYLOAD, events[:-1])):  # the usual case, in C
        return len(events)
    return next(n for n, event in enumerate(events, 1) if is_terminal(event))


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
    def last(self) -> int:
        return self.first + len(self.encoded) - 1


@dataclass(eq=False)  # each reader is itself: two at one sequence are not the same reader
class ReaderCursor:
    """Where one local reader of a session is: the last sequence it was given."""

    after: int = 0


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
        self._readers: dict[str, list[ReaderCursor]] = {}
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
        if tail.encoded and tail.last + 1 != first:
            # Another writer took over: the cached tail is no longer contiguous.
            tail.encoded, tail.nbytes, tail.terminals = [], 0, []
        if not tail.encoded:
            tail.first = first
        tail.encoded.extend(encoded)
        tail.nbytes += sum(map(len, encoded))
        if terminal:
            tail.terminals.append(tail.last)
        self._trim(tail, self._readers.get(session_id))
        waiter, tail.waiter = tail.waiter, asyncio.get_running_loop().create_future()
        waiter.set_result(None)
        tail.ended = terminal  # a continued session's new turn un-ends it
        if tail.ended and not self._readers.get(session_id):
            self.forget(session_id)

    def _trim(self, tail: _Tail, readers: list[ReaderCursor] | None) -> None:
        """Drop the oldest events past the bounds, keeping the newest one always."""
        count = len(tail.encoded)
        if count <= self._tail_size and tail.nbytes <= self._tail_bytes:
            return  # the usual case: nothing to drop, no per-reader work
        limit = count
        if readers:
            # Events after the slowest reader's sequence are still owed to it: those are
            # dropped only past the larger bounds.
            owed_from = max(0, min(r.after for r in readers) + 1 - tail.first)
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

    def since(self, session_id: str, after: int, limit: int) -> Batch | None:
        """Cached events with ``sequence > after``; ``None`` when the cache can't tell."""
        tail = self._tails.get(session_id)
        if tail is None:
            return None
        if not tail.encoded:  # caught up with a local writer that has yet to publish?
            return Batch([]) if tail.writing and after + 1 == tail.first else None
        if after + 1 < tail.first or (tail.ended and after >= tail.last):
            # Before the tail, or past a session's end: the store says which (at once,
            # where waiting on an ended tail would last a poll interval).
            return None
        start = after + 1 - tail.first
        stop = start + limit
        end = None  # where the reader's stream ends: the first terminal event after it
        if tail.terminals:  # none while the session runs (the usual case: no loop)
            end = next((n for n in tail.terminals if n > after), None)
            if end is not None:
                stop = min(stop, end + 1 - tail.first)
        encoded = tail.encoded[start:stop]
        last = after + len(encoded)
        return Batch(encoded, last, last == end)

    def waiter(self, session_id: str) -> asyncio.Future[None]:
        """A future resolved at the session's next ``publish``."""
        return self._tail(session_id).waiter

    def tails(self) -> int:
        """Sessions with a cached tail (for tests and metrics)."""
        return len(self._tails)

    @contextlib.contextmanager
    def reading(self, session_id: str, *, after: int = 0) -> Iterator[ReaderCursor]:
        """Register a reader; it moves its cursor as it is given events.

        The last reader out drops a tail no local writer fills.
        """
        cursor = ReaderCursor(after=after)
        self._readers.setdefault(session_id, []).append(cursor)
        try:
            yield cursor
        finally:
            readers = self._readers[session_id]
            readers.remove(cursor)
            if not readers:
                del self._readers[session_id]
                tail = self._tails.get(session_id)
                if tail is not None and (tail.ended or not (tail.encoded or tail.writing)):
                    del self._tails[session_id]


class SessionWriter:
    """Appends one session's events with group commit. One writer per session.

    ``emit`` never blocks; ``flush`` waits until everything emitted is durable and
    raises the store's error if a write failed (e.g. ``SequenceConflict`` when
    another process took the session over).
    """

    def __init__(
        self,
        store: Store,
        hub: EventHub,
        *,
        session_id: str,
        agent_type: str,
        last_sequence: int,
        event_session_id: str = "",
    ) -> None:
        self._store = store
        self._hub = hub
        self.session_id = session_id
        """The session's key in the store (and the hub)."""
        self.event_session_id = event_session_id or session_id
        """The id the events carry: their readers', when the store's key is another."""
        self.agent_type = agent_type
        self.last_sequence = last_sequence
        """The sequence of the last event in the store."""
        self.step = 0
        self._next_sequence = last_sequence + 1
        """The sequence the next emitted event gets: writes go in order, and a failed
        one stops the writer, so an event's sequence is known when it is emitted."""
        self._pending: list[bytes] = []
        """Emitted events not yet written, serialized with their sequences."""
        self._last: StreamEvent | None = None
        """The last pending event, when emitted as a message: whether it ends the
        session's stream is asked once per write, not of every event (forwarded bytes
        never do)."""
        self._update: SessionUpdate | None = None
        """A record update to apply with the next batch (see ``flush``)."""
        self._checkpoint: Checkpoint | None = None
        """A checkpoint to save with the next batch, at its end (see ``flush``)."""
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._closed = False
        hub.expect(session_id, self._next_sequence)

    def _stamp(self, event: StreamEvent) -> StreamEvent:
        event.session_id = self.event_session_id
        event.agent_type = self.agent_type
        if not event.step:
            event.step = self.step
        # divmod beats Timestamp.FromNanoseconds, which is pure Python and per event.
        event.time.seconds, event.time.nanos = divmod(time.time_ns(), 1_000_000_000)
        return event

    def emit(self, event: StreamEvent, *, defer: bool = False) -> None:
        """Queue ``event`` for the log (stamps session, agent type, step, time and the
        sequence it will have).

        With ``defer`` no write starts for it: the next ``emit`` or ``flush`` carries
        it. For an event the caller follows at once with more (a run's last events
        before its end), so they go in one write, not two.
        """
        if self._error is not None:
            raise self._error
        self._stamp(event).sequence = self._next_sequence
        self._next_sequence += 1
        # Serialized once, here: the store, the hub and every reader's response use these bytes.
        self._pending.append(event.SerializeToString())
        self._last = event
        if self._task is None and not defer:
            self._task = asyncio.create_task(self._drain())

    def emit_encoded(self, payloads: Sequence[bytes]) -> None:
        """Queue events given as their serialized payload: each one ``StreamEvent``
        oneof field (a forwarded child event, say), stamped like ``emit``, one time
        for all. Nothing parses or serializes them: the store and readers get these
        bytes behind the stamp. None of them may end the stream.
        """
        if self._error is not None:
            raise self._error
        if not payloads:
            return
        head = StreamEvent(
            session_id=self.event_session_id, agent_type=self.agent_type, step=self.step
        )
        head.time.seconds, head.time.nanos = divmod(time.time_ns(), 1_000_000_000)
        stamp = head.SerializeToString()
        sequence = self._next_sequence
        self._pending += sequenced_all(sequence, stamp, payloads)
        self._next_sequence = sequence + len(payloads)
        self._last = None
        if self._task is None:
            self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                update, self._update = self._update, None
                checkpoint, self._checkpoint = self._checkpoint, None
                if checkpoint is not None:  # taken where this batch leaves the log
                    checkpoint = dataclasses.replace(
                        checkpoint, last_sequence=self._next_sequence - 1
                    )
                terminal = self._last is not None and is_terminal(self._last)
                await self._write(batch, terminal, update, checkpoint)
        except BaseException as exc:
            self._error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self._task = None

    async def _write(
        self,
        encoded: list[bytes],
        terminal: bool,
        update: SessionUpdate | None,
        checkpoint: Checkpoint | None,
    ) -> None:
        # The fence fixed these events' sequences when they were emitted.
        first = self.last_sequence + 1
        self.last_sequence = await self._store.append(
            self.session_id,
            (),
            expected_sequence=self.last_sequence,
            update=update,
            encoded=encoded,
            checkpoint=checkpoint,
        )
        if not self._closed:
            self._hub.publish_encoded(self.session_id, first, encoded, terminal=terminal)

    def close(self) -> None:
        """The run is over: a write still in flight lands in the store, but its events
        are not published. Its hub tail is gone (``EventHub.forget``), and publishing
        would make a new one that nothing drops, which readers would wait on."""
        self._closed = True

    async def flush(
        self, update: SessionUpdate | None = None, *, checkpoint: Checkpoint | None = None
    ) -> None:
        """Wait until every emitted event is in the store.

        With ``update``, also apply it to the session record, and with ``checkpoint``
        save it (its ``last_sequence`` set to where the log then ends): in the same
        atomic write as the pending events when there are any (one store round trip,
        not two or three), else on their own.
        """
        if self._error is not None:
            raise self._error
        if update is not None:
            self._update = update
        if checkpoint is not None:
            self._checkpoint = checkpoint
        if self._task is None and self._pending:  # events emitted with defer
            self._task = asyncio.create_task(self._drain())
        while self._task is not None:
            await asyncio.shield(self._task)
        if self._error is not None:
            raise self._error
        if checkpoint is not None and self._checkpoint is not None:  # no batch carried it
            # An append of no events: the update (if no batch carried it either) and
            # the checkpoint in one fenced write.
            self._checkpoint = None
            update, self._update = self._update, None
            await self._store.append(
                self.session_id,
                (),
                expected_sequence=self.last_sequence,
                update=update,
                encoded=[],
                checkpoint=dataclasses.replace(checkpoint, last_sequence=self.last_sequence),
            )
        elif update is not None and self._update is not None:  # no batch carried it
            self._update = None
            await self._store.update_session(self.session_id, update)

    async def finish(
        self, event: StreamEvent, update: SessionUpdate, *, checkpoint: Checkpoint | None = None
    ) -> None:
        """Append a terminal ``event`` together with the session ``update`` (and a
        ``checkpoint``, see ``flush``), atomically.

        Events still pending go in the same write (the run's last events, its output
        and its end: usually one store round trip, not two).
        """
        self.emit(event)
        await self.flush(update, checkpoint=checkpoint)


async def follow(
    store: Store,
    hub: EventHub,
    session_id: str,
    *,
    from_sequence: int,
    batch_limit: int = READ_LIMIT,
    poll_interval_s: float = 0.5,
    idle_s: float | None = None,
) -> AsyncIterator[Batch]:
    """Yield batches of events with ``sequence > from_sequence`` until the terminal event.

    Replays from the store, then tails ``hub``; every ``poll_interval_s`` without a
    wake-up it re-reads the store, which covers writers in other processes. With
    ``idle_s``, an empty batch is yielded whenever ``idle_s`` passed without one
    (checked at each wake-up or poll): the caller's cue for a heartbeat.

    Raises:
        SessionNotFound: the session does not exist.
    """
    with hub.reading(session_id, after=from_sequence) as cursor:
        async for batch in _follow(
            store, hub, session_id, cursor, batch_limit, poll_interval_s, idle_s
        ):
            yield batch


async def _follow(
    store: Store,
    hub: EventHub,
    session_id: str,
    cursor: ReaderCursor,
    batch_limit: int,
    poll_interval_s: float,
    idle_s: float | None = None,
) -> AsyncIterator[Batch]:
    last = cursor.after
    force_store = False
    quiet_since = time.monotonic()
    # A heartbeat interval shorter than the poll interval shortens the waits too.
    poll_interval_s = poll_interval_s if idle_s is None else min(poll_interval_s, idle_s)
    while True:
        if idle_s is not None and time.monotonic() - quiet_since >= idle_s:
            yield Batch([])  # quiet for idle_s: a heartbeat is due
            quiet_since = time.monotonic()
        waiter = hub.waiter(session_id)
        batch = None if force_store else hub.since(session_id, last, batch_limit)
        if batch is not None and not batch.encoded:
            # Caught up with this process's writer: wait for its next publish, and
            # after a quiet poll interval check the store (another process may write).
            force_store = not await _wait(waiter, poll_interval_s)
            continue
        if batch is None:
            events = await store.read(session_id, from_sequence=last, limit=batch_limit)
            if events and (through := through_terminal(events)) < len(events):
                events = events[:through]
            batch = Batch(
                [event.SerializeToString() for event in events],
                events[-1].sequence if events else 0,
                bool(events) and is_terminal(events[-1]),
            )
        force_store = False
        if batch.encoded:
            last = cursor.after = batch.last_sequence
            yield batch
            if batch.terminal:
                return
            if idle_s is not None:
                quiet_since = time.monotonic()
            continue
        record = await store.get_session(session_id)
        if record is None:
            raise SessionNotFound(session_id)
        if record.status.is_terminal and record.last_sequence <= last:
            return  # finished, and the reader already has everything
        if isinstance(store, EventNotifier):
            await _wait_either(waiter, store, session_id, last, poll_interval_s)
        else:
            await _wait(waiter, poll_interval_s)


_NOTICE_GRACE_S = 0.25


async def _wait_either(
    waiter: asyncio.Future[None],
    store: EventNotifier,
    session_id: str,
    last: int,
    timeout_s: float,
) -> None:
    """Wake on a local publish or on the store's notice of an append in any process."""
    deadline = time.monotonic() + timeout_s
    local = asyncio.ensure_future(asyncio.shield(waiter))
    notice = asyncio.ensure_future(
        store.wait_for_events(session_id, from_sequence=last, timeout_s=timeout_s)
    )
    waits: set[asyncio.Future[Any]] = {local, notice}
    try:
        # A notice that times out returns by itself; the grace lets it, since cancelling
        # a blocked read costs its connection (redis-py drops it): one a poll a reader.
        done, _ = await asyncio.wait(
            waits, timeout=timeout_s + _NOTICE_GRACE_S, return_when=asyncio.FIRST_COMPLETED
        )
        if notice in done and notice.exception() is not None and local not in done:
            # The store cannot wait now (its notices are down): poll, do not spin.
            await asyncio.wait({local}, timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for task in waits:
            task.cancel()
        await asyncio.wait(waits)
        for task in waits:
            if not task.cancelled():
                task.exception()  # a store error here resurfaces at the next read


async def _wait(waiter: asyncio.Future[None], timeout_s: float) -> bool:
    """Wait for ``waiter``; False on timeout.

    The reader awaits a future of its own, never the shared ``waiter`` (which its
    cancellation would cancel for every reader). A done-callback and a timer cost
    about half of ``asyncio.timeout`` around ``asyncio.shield``, and this runs once
    per wake-up per reader.
    """
    if waiter.done():
        return True
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[bool] = loop.create_future()

    def wake(_: object = None, value: bool = True) -> None:
        if not woken.done():
            woken.set_result(value)

    waiter.add_done_callback(wake)
    timer = loop.call_later(timeout_s, wake, None, False)
    try:
        return await woken
    finally:
        timer.cancel()
        waiter.remove_done_callback(wake)
