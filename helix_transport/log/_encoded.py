"""Where a stream ends in a page of serialized events, found without parsing each one.

A replayed page goes to the reader as the bytes the store keeps; the one thing the
reader's loop must know of them is where the first terminal event is (a continued
session's log goes on after it). A terminal event's payload is a top-level field,
so its bytes hold that field's key: a scan of the joined page for the keys finds
every candidate, and only a candidate is parsed (a key's two bytes also turn up
inside other fields, e.g. a timestamp's nanoseconds, so a hit is not proof).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Sequence

from helix_transport._events import TERMINAL_KINDS, is_terminal, through_terminal
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport._wire import varint
from helix_transport.log.hub import Batch
from helix_transport.store import EncodedEventReader, Store


def _keys() -> list[bytes]:
    fields = StreamEvent.DESCRIPTOR.fields_by_name
    return sorted(varint(fields[kind].number << 3 | 2) for kind in TERMINAL_KINDS)


_KEYS = _keys()
# Every terminal payload's key is two bytes ending alike (fields 16-31): the first
# bytes are mapped to one, so a single ``find`` looks for all of them at C speed.
assert all(len(key) == 2 and key[1] == _KEYS[0][1] for key in _KEYS), _KEYS
_NEEDLE = _KEYS[0]
_FOLD = bytes.maketrans(bytes(key[0] for key in _KEYS), bytes([_NEEDLE[0]] * len(_KEYS)))


def first_terminal(encoded: Sequence[bytes]) -> int | None:
    """The index of the first terminal event among ``encoded``, or None."""
    joined = b"".join(encoded).translate(_FOLD)
    at = joined.find(_NEEDLE)
    if at < 0:  # the usual page: no candidate at all
        return None
    ends = list(itertools.accumulate(map(len, encoded)))
    while at >= 0:
        index = bisect.bisect_right(ends, at)
        if is_terminal(StreamEvent.FromString(encoded[index])):
            return index
        at = joined.find(_NEEDLE, ends[index])  # on from the next event
    return None


class Pages:
    """One reader's reads of a session's log in the store, as batches of bytes, with at
    most one read started ahead (while the reader sends a page, the next one is read:
    a store round trip, or SQLite's worker, overlaps the sending)."""

    def __init__(self, store: Store, session_id: str, limit: int) -> None:
        self._store = store
        self._encoded = store if isinstance(store, EncodedEventReader) else None
        self._session_id = session_id
        self._limit = limit
        self._ahead: asyncio.Task[Batch] | None = None
        self._ahead_from = 0

    async def read(self, from_sequence: int) -> Batch:
        """The events after ``from_sequence``: a page, up to and with a terminal one."""
        if self._encoded is not None:
            encoded = await self._encoded.read_encoded(
                self._session_id, from_sequence=from_sequence, limit=self._limit
            )
            if not encoded:
                return Batch([])
            end = first_terminal(encoded)
            if end is not None:
                del encoded[end + 1 :]
            return Batch(encoded, from_sequence + len(encoded), end is not None)
        events = await self._store.read(
            self._session_id, from_sequence=from_sequence, limit=self._limit
        )
        if events and (through := through_terminal(events)) < len(events):
            events = events[:through]
        return Batch(
            [event.SerializeToString() for event in events],
            events[-1].sequence if events else 0,
            bool(events) and is_terminal(events[-1]),
        )

    def prefetch(self, from_sequence: int) -> None:
        """Start reading the page after ``from_sequence`` now; ``started`` hands it over."""
        self.close()
        self._ahead = asyncio.ensure_future(self.read(from_sequence))
        self._ahead_from = from_sequence

    def started(self, from_sequence: int) -> asyncio.Task[Batch] | None:
        """The read started ahead from ``from_sequence``, if any (it is the caller's now)."""
        if self._ahead is not None and self._ahead_from == from_sequence:
            ahead, self._ahead = self._ahead, None
            return ahead
        self.close()  # from elsewhere: not wanted
        return None

    def close(self) -> None:
        """Drop a read started ahead (its error, if any, is not reported)."""
        if self._ahead is not None:
            self._ahead.cancel()
            self._ahead.add_done_callback(_retrieve)
            self._ahead = None


def _retrieve(task: asyncio.Future[Batch]) -> None:
    if not task.cancelled():
        task.exception()
