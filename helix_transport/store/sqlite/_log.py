"""The event log in an SQLite store: group-committed appends and reads."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import sqlite3
import time
from collections.abc import Iterator, Sequence

from helix_transport._exceptions import (
    SequenceConflict,
    SessionNotFound,
)
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store._base import appended_count
from helix_transport.store._records import SessionUpdate
from helix_transport.store.sqlite._checkpoints import CheckpointParams, write_checkpoint
from helix_transport.store.sqlite._conn import UNBINDABLE, store_error, transaction
from helix_transport.store.sqlite._sessions import WRITE_STATE, require_session, session_params

_LAST_SEQUENCE = "SELECT last_sequence FROM sessions WHERE session_id = ?"
# The fence and the new end in one statement: no row changed means a conflict (or
# no such session), found out before anything is written.
_ADVANCE_LAST_SEQUENCE = (
    "UPDATE sessions SET last_sequence = ? WHERE session_id = ? AND last_sequence = ?"
)
_ROWS_PER_INSERT = 5_000
"""Events per INSERT statement at most (3 parameters each), where the library's
parameter limit allows it (old builds allow 999). Fewer statements matter more than
their size: the worker re-takes the GIL after every one, and while the event loop is
busy each re-take waits for the loop's next pause (a 1,000-event append under a busy
loop: 11.7 ms at 300 rows per statement, 9.4 ms at one statement)."""
_VIEW_MAX_EVENTS = 4
"""Appends of more events go one by one (a fenced ``UPDATE`` and one multi-row
``INSERT``): the view's trigger checks and updates per row, extra work for a parent
storing a child's events 100 at a time (two hops 0.56/0.55 -> 0.51/0.52x in 2 pairs
with every append through the view; later pairs with and without this bound overlapped).
The view's gain is for batches of many sessions' single events."""
_STATEMENTS_KEPT = 256
"""Multi-row statements kept per row count: bounded, since a batch of up to 5,000 rows
is a string of up to 55 kB, and batch sizes vary over a service's life."""
_READ_BYTES = 4 << 20
"""A read stops once its events pass this many bytes (it always returns one)."""
# One statement, one result row: sqlite3 releases the GIL around every step, and
# while the event loop is busy each re-take waits up to a switch interval, so a
# row per event made a 1,000-event read 30-400x slower under load (a GIL convoy).
_READ_EVENTS = (
    "SELECT group_concat(hex(data), ',') FROM ("
    " SELECT data, sum(length(data)) OVER (ORDER BY sequence ROWS UNBOUNDED PRECEDING) AS upto"
    " FROM events WHERE session_id = ? AND sequence > ? ORDER BY sequence LIMIT ?"
    f") WHERE upto - length(data) < {_READ_BYTES}"
)


_PAGE = "SELECT sequence, data FROM events WHERE session_id = :s AND sequence > :f"
# The same page as bytes, without a window function over every row in the usual case
# (it cost more than the rest of the read): a page of at most _READ_BYTES is taken
# whole; only a larger one counts how many of its events start below that.
_FITS = (
    f"SELECT CASE WHEN sum(length(data)) <= {_READ_BYTES} THEN count(*) ELSE ("
    " SELECT count(*) FROM ("
    "  SELECT length(data) AS size,"
    "  sum(length(data)) OVER (ORDER BY sequence ROWS UNBOUNDED PRECEDING) AS upto"
    f"  FROM ({_PAGE} ORDER BY sequence LIMIT :n)) WHERE upto - size < {_READ_BYTES}"
    f") END FROM ({_PAGE} ORDER BY sequence LIMIT :n)"
)
# The events' bytes end to end (a blob's group_concat keeps its bytes; CAST makes the
# text a blob again), their lengths and sequences, in one row: no hex, no parse.
_READ_ENCODED = (
    "SELECT CAST(group_concat(data, x'') AS BLOB), group_concat(length(data)),"
    f" group_concat(sequence) FROM ({_PAGE} ORDER BY sequence LIMIT ({_FITS}))"
)


@dataclasses.dataclass(frozen=True)
class Append:
    session_id: str
    events: Sequence[StreamEvent]
    expected_sequence: int
    update: SessionUpdate | None
    encoded: Sequence[bytes] | None
    checkpoint: CheckpointParams | None
    done: asyncio.Future[int]


def read_events(conn: sqlite3.Connection, params: tuple[str, int, int]) -> str:
    (joined,) = conn.execute(_READ_EVENTS, params).fetchone()
    return joined or ""


EncodedRow = tuple[bytes | None, str | None, str | None]


def read_encoded(conn: sqlite3.Connection, session_id: str, after: int, limit: int) -> EncodedRow:
    """A page of events as their stored bytes end to end, their sizes and sequences."""
    row: EncodedRow = conn.execute(
        _READ_ENCODED, {"s": session_id, "f": after, "n": limit}
    ).fetchone()
    return row


def split_encoded(row: EncodedRow, after: int) -> list[bytes] | None:
    """``read_encoded``'s row as each event's bytes; None unless they are the events
    right after ``after`` in order (group_concat keeps the subquery's order in
    practice, not by contract: the caller then reads as ``read_events`` does)."""
    joined, sizes, sequences = row
    if joined is None or sizes is None:
        return []
    ends = list(itertools.accumulate(map(int, sizes.split(","))))
    if ends[-1] != len(joined) or sequences != ",".join(
        map(str, range(after + 1, after + 1 + len(ends)))
    ):
        return None
    return [joined[start:end] for start, end in zip([0, *ends], ends, strict=False)]


def parse_events(joined: str) -> list[StreamEvent]:
    if not joined:
        return []
    events = [StreamEvent.FromString(bytes.fromhex(data)) for data in joined.split(",")]
    # group_concat keeps the subquery's order in practice, not by contract: check it.
    if any(a.sequence >= b.sequence for a, b in itertools.pairwise(events)):
        events.sort(key=lambda event: event.sequence)
    return events


def append_batch(conn: sqlite3.Connection, *, batch: list[Append]) -> list[int | Exception]:
    """Several appends in one transaction: the last sequence of each, or the error
    that failed that one alone (a conflict or a missing session, both found out
    before that append writes anything, so no savepoint is needed to undo it).

    The plain appends (fenced, of a few events, no record update, their session's only
    one in the batch) go in as one ``INSERT`` through ``helix_appends``; a batch of nothing else
    is that one statement, without ``BEGIN`` and ``COMMIT``. The worker re-takes the
    GIL after every statement, and in a busy service each re-take waits for the event
    loop's next pause: two statements per session, then four per batch, made a batch's
    wall time mostly waiting. A batch in which a fence misses is redone append by
    append, which finds each one's error.
    """
    previous = [[event.sequence for event in item.events] for item in batch]
    together = _plain_appends(batch)
    try:
        if together:
            try:
                return _append_items(conn, batch, previous, together)
            except _FenceMissed:
                pass  # nothing was stored, every event's sequence restored
        return _append_items(conn, batch, previous, [])
    except UNBINDABLE:
        if len(batch) == 1:
            raise
    # An error found only by SQLite itself (a value it cannot bind, a full disk) rolled
    # the whole batch back: redo it append by append, so that it fails only its own.
    results: list[int | Exception] = []
    for item, sequences in zip(batch, previous, strict=True):
        try:
            results += _append_items(conn, [item], [sequences], [])
        except UNBINDABLE as exc:
            results.append(store_error(exc))
    return results


def _append_items(
    conn: sqlite3.Connection,
    batch: list[Append],
    previous: list[list[int]],
    together: list[int],
) -> list[int | Exception]:
    results: list[int | Exception | None] = [None] * len(batch)
    params: list[object] = []
    for i in together:
        item = batch[i]
        results[i] = _event_rows(
            params, item.session_id, item.events, item.expected_sequence, item.encoded
        )
    chunks = list(_chunks(conn, params))
    try:
        if len(together) == len(batch) and len(chunks) == 1:
            _insert_through_view(conn, chunks)  # one statement: atomic on its own
        else:
            with transaction(conn):
                _insert_through_view(conn, chunks)
                _append_rest(conn, batch, previous, results)
    except BaseException:
        # Nothing was stored, so no caller's events may claim sequences either.
        for item, sequences in zip(batch, previous, strict=True):
            _restore(item.events, sequences)
        raise
    return [result for result in results if result is not None]


def _insert_through_view(conn: sqlite3.Connection, chunks: list[list[object]]) -> None:
    try:
        for chunk in chunks:
            conn.execute(_append_rows_sql(len(chunk) // 3), chunk)
    except sqlite3.IntegrityError as exc:  # a fence missed (or its events exist already)
        raise _FenceMissed from exc


def _append_rest(
    conn: sqlite3.Connection,
    batch: list[Append],
    previous: list[list[int]],
    results: list[int | Exception | None],
) -> None:
    """The appends not in together, one by one, inside the caller's transaction."""
    for i, (item, sequences) in enumerate(zip(batch, previous, strict=True)):
        if results[i] is not None:
            continue
        try:
            results[i] = _append_rows(
                conn,
                item.session_id,
                item.events,
                item.expected_sequence,
                item.update,
                item.encoded,
                item.checkpoint,
            )
        except (SequenceConflict, SessionNotFound) as exc:
            _restore(item.events, sequences)
            results[i] = exc


class _FenceMissed(Exception):
    """A log was not where its writer expected it: redo the batch append by append."""


def _plain_appends(batch: list[Append]) -> list[int]:
    """Indices of the appends that can go in together: fenced, small, without a record
    update, and their session's only append in the batch."""
    per_session = collections.Counter(item.session_id for item in batch)
    return [
        i
        for i, item in enumerate(batch)
        if item.update is None
        and item.checkpoint is None
        and 0 < appended_count(item.events, item.encoded) <= _VIEW_MAX_EVENTS
        and per_session[item.session_id] == 1
    ]


@functools.lru_cache(maxsize=_STATEMENTS_KEPT)
def _append_rows_sql(count: int) -> str:
    return "INSERT INTO helix_appends (session_id, sequence, data) VALUES " + ", ".join(
        ["(?, ?, ?)"] * count
    )


def _restore(events: Sequence[StreamEvent], sequences: list[int]) -> None:
    for event, sequence in zip(events, sequences, strict=True):
        event.sequence = sequence


def _append_rows(
    conn: sqlite3.Connection,
    session_id: str,
    events: Sequence[StreamEvent],
    expected_sequence: int,
    update: SessionUpdate | None,
    encoded: Sequence[bytes] | None = None,
    checkpoint: CheckpointParams | None = None,
) -> int:
    """One append inside the caller's transaction; raises before writing anything."""
    if update is None:
        # The usual append (fenced, no record update): one UPDATE checks the fence and
        # moves the end; decoding the whole record would cost more than the insert.
        last = expected_sequence + appended_count(events, encoded)
        if conn.execute(_ADVANCE_LAST_SEQUENCE, (last, session_id, expected_sequence)).rowcount:
            last = _insert_events(
                conn, session_id, events, expected_sequence, expected_sequence, encoded
            )
            write_checkpoint(conn, checkpoint)
            return last
        row = conn.execute(_LAST_SEQUENCE, (session_id,)).fetchone()
        if row is None:
            raise SessionNotFound(session_id)
        raise SequenceConflict(session_id, expected_sequence, row[0])
    record = require_session(conn, session_id)
    last = _insert_events(
        conn, session_id, events, expected_sequence, record.last_sequence, encoded
    )
    record = update.apply(record, now=time.time())
    conn.execute(WRITE_STATE, session_params(dataclasses.replace(record, last_sequence=last)))
    write_checkpoint(conn, checkpoint)  # check_checkpoint made sure it is at ``last``
    return last


def _insert_events(
    conn: sqlite3.Connection,
    session_id: str,
    events: Sequence[StreamEvent],
    expected_sequence: int,
    last: int,
    encoded: Sequence[bytes] | None = None,
) -> int:
    """Insert ``events`` after ``last`` (the log's end); the new last sequence."""
    if expected_sequence != last:
        raise SequenceConflict(session_id, expected_sequence, last)
    params: list[object] = []
    last = _event_rows(params, session_id, events, last, encoded)
    _insert_params(conn, params)
    return last


def _event_rows(
    params: list[object],
    session_id: str,
    events: Sequence[StreamEvent],
    last: int,
    encoded: Sequence[bytes] | None,
) -> int:
    """Number ``events`` after ``last`` and add their rows (``encoded``, when given) to
    ``params``; the new last."""
    for sequence, event in enumerate(events, last + 1):
        event.sequence = sequence
    if encoded is None:
        encoded = [event.SerializeToString() for event in events]
    # The rows' parameters laid out by slice, in C: a tuple per event built and added
    # in Python held the GIL the event loop wants (0.042 -> 0.017 us an event).
    count = len(encoded)
    rows: list[object] = [session_id] * (3 * count)
    rows[1::3] = range(last + 1, last + 1 + count)
    rows[2::3] = encoded
    params += rows
    return last + count


def _insert_params(conn: sqlite3.Connection, params: list[object]) -> None:
    # Many rows per statement, not executemany's row per step (see _READ_EVENTS).
    for chunk in _chunks(conn, params):
        conn.execute(_insert_rows(len(chunk) // 3), chunk)


def _chunks(conn: sqlite3.Connection, params: list[object]) -> Iterator[list[object]]:
    """``params`` of three-parameter rows, as many rows per statement as allowed."""
    step = 3 * min(_ROWS_PER_INSERT, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // 3)
    for start in range(0, len(params), step):
        yield params[start : start + step]


@functools.lru_cache(maxsize=_STATEMENTS_KEPT)
def _insert_rows(count: int) -> str:
    return "INSERT INTO events (session_id, sequence, data) VALUES " + ", ".join(
        ["(?, ?, ?)"] * count
    )
