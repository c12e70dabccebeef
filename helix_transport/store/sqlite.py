"""The embedded durable store: one SQLite file, safe to share between processes.

All SQLite work runs on one worker thread the store owns, so the event loop never
blocks on disk and the connection is only ever touched by the thread that made it.
The worker takes every call queued while it was busy and hands their results back
to the event loop in one wake-up.
Every ``Store`` method is a single transaction; writes start with ``BEGIN
IMMEDIATE`` so they take SQLite's write lock up front and stay atomic when several
processes open the same file.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from helix_transport._exceptions import (
    SequenceConflict,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport._status import SessionStatus
from helix_transport.store import _sqlite_outbox as outbox
from helix_transport.store._base import (
    READ_LIMIT,
    appended_count,
    check_checkpoint,
    check_lease,
    given_bytes,
)
from helix_transport.store._records import (
    Checkpoint,
    ChildCommand,
    RemoteCursor,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    Usage,
    merge_commands,
)
from helix_transport.store._sqlite_checkpoint import Checkpointer

SCHEMA_VERSION = 3
"""The schema this module writes; a file with a newer version is refused."""

_T = TypeVar("_T")
_A = TypeVar("_A")

# Errors of the environment (locked past busy_timeout, unopenable file, full or
# failing disk) that may clear up on their own; anything else is a bug or corruption.
_TRANSIENT_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_PROTOCOL,
    }
)

# Column names are the record fields' names; metadata, usage, messages and state are JSON.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, agent_type TEXT NOT NULL, input_json TEXT NOT NULL,
    input_hash TEXT NOT NULL, status TEXT NOT NULL, parent_session_id TEXT NOT NULL,
    metadata TEXT NOT NULL, output_json TEXT NOT NULL, error TEXT NOT NULL,
    failure_reason TEXT NOT NULL, step_count INTEGER NOT NULL, usage TEXT NOT NULL,
    last_sequence INTEGER NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    finished_at REAL, owner TEXT NOT NULL, lease_expires_at REAL NOT NULL
);
-- Startup scans for RUNNING sessions to resume.
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions (status);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL, sequence INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (session_id, sequence)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    session_id TEXT PRIMARY KEY, step INTEGER NOT NULL, messages TEXT NOT NULL,
    usage TEXT NOT NULL, last_sequence INTEGER NOT NULL, state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS interrupts (session_id TEXT PRIMARY KEY, reason TEXT NOT NULL);
-- position keeps the order refs were first stored, remote_* are NULL for a local child.
CREATE TABLE IF NOT EXISTS subsession_refs (
    parent_session_id TEXT NOT NULL, child_session_id TEXT NOT NULL,
    position INTEGER NOT NULL, agent_type TEXT NOT NULL, tool_call_id TEXT NOT NULL,
    status TEXT NOT NULL, address TEXT NOT NULL, started_at REAL NOT NULL,
    completed_at REAL, remote_stream_id TEXT, remote_last_sequence INTEGER,
    output_json TEXT NOT NULL, error TEXT NOT NULL, failure_reason TEXT NOT NULL,
    PRIMARY KEY (parent_session_id, child_session_id)
);
"""

# What takes a file of version N - 1 to N (the version 1 schema is _SCHEMA above).
# Never edit a released upgrade: append one.
_UPGRADES: dict[int, tuple[str, ...]] = {
    # 2: sessions belong to the principal (and tenant) that started them.
    2: (
        "ALTER TABLE sessions ADD COLUMN principal TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
    ),
    # 3: the outbox of commands for children (interrupts a child's service must take).
    3: outbox.UPGRADE,
}

# Derived from the records so a new field without a schema migration fails loudly
# ("no column named ...") instead of being dropped silently.
_SESSION_COLUMNS = [f.name for f in dataclasses.fields(SessionRecord)]
# What update_session/append may change; leases are written only by the lease methods.
_STATE_COLUMNS = [
    *(f.name for f in dataclasses.fields(SessionUpdate)),
    "last_sequence",
    "updated_at",
    "finished_at",
]
_REF_COLUMNS = [
    *(f.name for f in dataclasses.fields(SubSessionRef) if f.name != "remote"),
    "remote_stream_id",
    "remote_last_sequence",
]

_INSERT_SESSION = (
    f"INSERT INTO sessions ({', '.join(_SESSION_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in _SESSION_COLUMNS)}) "
    "ON CONFLICT (session_id) DO NOTHING"
)
_WRITE_STATE = (
    f"UPDATE sessions SET {', '.join(f'{c} = :{c}' for c in _STATE_COLUMNS)} "
    "WHERE session_id = :session_id"
)
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
# A batch's plain appends as one statement: a row inserted into this view checks its
# session's fence, moves the log's end and stores the event, all inside SQLite. TEMP: it
# lives on the store's own connection only, so the file's schema (and any other process
# on it) is untouched. A missed fence aborts the whole statement, leaving nothing.
_APPEND_VIEW = (
    "CREATE TEMP VIEW IF NOT EXISTS helix_appends (session_id, sequence, data) AS "
    "SELECT session_id, sequence, data FROM main.events WHERE 0",
    """CREATE TEMP TRIGGER IF NOT EXISTS helix_append INSTEAD OF INSERT ON helix_appends BEGIN
    SELECT RAISE(ABORT, 'helix: the log does not end where its writer expected')
    WHERE NOT EXISTS (
        SELECT 1 FROM sessions
        WHERE session_id = NEW.session_id AND last_sequence = NEW.sequence - 1
    );
    UPDATE sessions SET last_sequence = NEW.sequence WHERE session_id = NEW.session_id;
    INSERT INTO events (session_id, sequence, data) VALUES (NEW.session_id, NEW.sequence, NEW.data);
END""",
)
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
# A new ref goes after the parent's others; a replaced one keeps its position.
_PUT_REF = (
    f"INSERT INTO subsession_refs (position, {', '.join(_REF_COLUMNS)}) VALUES ("
    "(SELECT COALESCE(MAX(position), 0) + 1 FROM subsession_refs"
    " WHERE parent_session_id = :parent_session_id), "
    f"{', '.join(':' + c for c in _REF_COLUMNS)}) "
    "ON CONFLICT (parent_session_id, child_session_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _REF_COLUMNS if not c.endswith("session_id"))
)
_ACQUIRE_LEASE = (
    "UPDATE sessions SET owner = :owner, lease_expires_at = :expires "
    "WHERE session_id = :session_id "
    "AND (owner = '' OR owner = :owner OR lease_expires_at <= :now)"
)


@contextmanager
def _map_sqlite_errors() -> Iterator[None]:
    """Translate ``sqlite3`` exceptions into the helix error tree."""
    try:
        yield
    except _UNBINDABLE as exc:
        raise _store_error(exc) from exc


_UNBINDABLE = (sqlite3.Error, OverflowError, UnicodeEncodeError)
"""What sqlite3 raises for a value it cannot bind (an integer past 64 bits, a lone
surrogate) besides its own errors."""


def _store_error(exc: Exception) -> StoreError:
    if not isinstance(exc, sqlite3.Error):
        return StoreError(f"sqlite: cannot store a value: {exc}")
    # Extended result codes carry the primary code in their low byte.
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code in _TRANSIENT_CODES:
        return StoreUnavailable(f"sqlite: {exc}")
    return StoreError(f"sqlite: {exc}")


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction: commit on success, roll back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        # A failed COMMIT can leave the transaction open; never leak it to the next call.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class SqliteStore:
    """A ``Store`` in one SQLite file (WAL mode), the embedded durable default.

    Open it with ``await SqliteStore.open(path)`` and close it with ``aclose()`` or
    ``async with``. Several processes may open the same file: every write is one
    ``BEGIN IMMEDIATE`` transaction, and sequences come from the session row inside
    it, so two writers can never interleave a log.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        worker: _Worker,
        checkpointer: Checkpointer | None = None,
    ) -> None:
        """Wrap ``conn``, which must have been opened on ``worker``'s thread.

        Prefer ``SqliteStore.open``; the store owns all three and closes them.
        """
        self._conn = conn
        self._worker = worker
        self._checkpointer = checkpointer
        self._closed = False
        self._appends: list[_Append] = []
        """Appends waiting for the worker's next transaction."""
        self._append_task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, path: str, *, busy_timeout_s: float = 5.0) -> SqliteStore:
        """Open (creating if needed) the database at ``path`` and its schema.

        Args:
            path: a file path (parent directories are created) or ``":memory:"``.
            busy_timeout_s: how long a write waits for another process's lock
                before failing with ``StoreUnavailable``.

        Raises:
            StoreUnavailable: the file cannot be opened or created.
            StoreError: the file is not a helix database of a known schema version, or
                the SQLite library is older than 3.25 (reads use a window function).
        """
        if sqlite3.sqlite_version_info < (3, 25, 0):
            raise StoreError(
                f"sqlite: SQLite {sqlite3.sqlite_version} is too old; helix needs 3.25 or newer"
            )
        worker = _Worker()
        try:
            conn = await worker.run(functools.partial(_connect, path, busy_timeout_s))
        except BaseException:
            worker.stop()
            raise
        checkpointer = None
        if path != ":memory:":  # an in-memory database has no log
            try:
                checkpointer = await worker.run(functools.partial(_start_checkpointer, conn, path))
            except BaseException:
                await worker.run(conn.close)
                worker.stop()
                raise
        return cls(conn, worker, checkpointer)

    async def __aenter__(self) -> SqliteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        """Create ``record`` unless its id exists (see ``Store.create_session``)."""
        check_lease(record, lease_ttl_s)
        return await self._run(lambda conn: _create_session(conn, record, lease_ttl_s))

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when it does not exist."""
        return await self._run(lambda conn: _get_session(conn, session_id))

    async def update_session(
        self,
        session_id: str,
        update: SessionUpdate,
        *,
        expected_status: SessionStatus | None = None,
    ) -> SessionRecord | None:
        """Apply ``update``, optionally only while the status matches.

        Raises:
            SessionNotFound: no such session.
        """
        return await self._run(
            lambda conn: _update_session(conn, session_id, update, expected_status)
        )

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        """Sessions in ``status``, oldest first."""
        sql = "SELECT * FROM sessions WHERE status = ? ORDER BY created_at, session_id"
        return await self._run(
            lambda conn: [_session_from_row(r) for r in conn.execute(sql, (status.value,))]
        )

    async def append(
        self,
        session_id: str,
        events: Sequence[StreamEvent],
        *,
        expected_sequence: int,
        update: SessionUpdate | None = None,
        encoded: Sequence[bytes] | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> int:
        """Append ``events``, assigning their sequences in place (see ``Store.append``).

        When the append fails, the events keep the sequences they had before.

        Raises:
            SessionNotFound: no such session.
            SequenceConflict: the log does not end at ``expected_sequence``.
        """
        if self._closed:
            raise UsageError("SqliteStore is closed")
        # Group commit across sessions: appends queued while the worker runs a batch
        # go together into its next transaction (an append's conflict is found before
        # it writes, so it fails only that append).
        encoded = given_bytes(events, encoded)
        check_checkpoint(session_id, checkpoint, expected_sequence, appended_count(events, encoded))
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._appends.append(
            _Append(
                session_id,
                events,
                expected_sequence,
                update,
                encoded,
                # Serialized here, not in the batch: a checkpoint that cannot be stored
                # fails its own append, not every append sharing its transaction.
                None if checkpoint is None else _checkpoint_params(checkpoint),
                done,
            )
        )
        if self._append_task is None:
            self._append_task = asyncio.create_task(self._drain_appends())
        return await done

    async def _drain_appends(self) -> None:
        try:
            while self._appends:
                batch, self._appends = self._appends, []
                try:
                    results = await self._run(functools.partial(_append_batch, batch=batch))
                except BaseException as exc:
                    for item in batch:
                        if not item.done.done():
                            item.done.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for item, result in zip(batch, results, strict=True):
                    if item.done.done():  # its caller gave up waiting
                        continue
                    if isinstance(result, BaseException):
                        item.done.set_exception(result)
                    else:
                        item.done.set_result(result)
        finally:
            self._append_task = None

    async def read(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[StreamEvent]:
        """Up to ``limit`` (at most ``READ_LIMIT``) events after ``from_sequence``.

        An unknown session reads as an empty log.
        """
        params = (session_id, from_sequence, max(min(limit, READ_LIMIT), 0))
        # Parsed here, not on the worker: parsing holds the GIL wherever it runs, and on
        # the worker it would also have to win the GIL back from a busy loop.
        return _parse_events(await self._run(lambda conn: _read_events(conn, params)))

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the session's checkpoint, fenced by the log's end (see ``Store``)."""
        await self._run(lambda conn: _save_checkpoint(conn, checkpoint))

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's latest checkpoint, or ``None``."""
        return await self._run(lambda conn: _load_checkpoint(conn, session_id))

    async def set_interrupt(self, session_id: str, reason: str) -> None:
        """Record an interrupt request; a later one replaces an untaken one."""
        sql = "INSERT OR REPLACE INTO interrupts (session_id, reason) VALUES (?, ?)"
        await self._run(lambda conn: _write(conn, sql, (session_id, reason)))

    async def take_interrupt(self, session_id: str) -> str | None:
        """Read and clear the session's interrupt request."""
        return await self._run(lambda conn: _take_interrupt(conn, session_id))

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` with an untaken interrupt request."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        return await self._run(lambda conn: _pending_interrupts(conn, ids))

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        """Insert or replace the ref keyed by (parent, child session id)."""
        await self._run(lambda conn: _write(conn, _PUT_REF, _ref_params(ref)))

    async def list_subsession_refs(self, parent_session_id: str) -> list[SubSessionRef]:
        """The parent's refs, in the order they were first stored."""
        sql = "SELECT * FROM subsession_refs WHERE parent_session_id = ? ORDER BY position"
        return await self._run(
            lambda conn: [_ref_from_row(r) for r in conn.execute(sql, (parent_session_id,))]
        )

    async def get_subsession_ref(
        self, parent_session_id: str, child_session_id: str
    ) -> SubSessionRef | None:
        """The ref keyed by (parent, child session id), or ``None``."""
        sql = "SELECT * FROM subsession_refs WHERE parent_session_id = ? AND child_session_id = ?"

        def get(conn: sqlite3.Connection) -> SubSessionRef | None:
            row = conn.execute(sql, (parent_session_id, child_session_id)).fetchone()
            return None if row is None else _ref_from_row(row)

        return await self._run(get)

    async def put_commands(self, commands: Sequence[ChildCommand]) -> None:
        """Record ``commands`` in one transaction (an upsert keeping the first
        ``created_at``; see ``Store``)."""
        merged = merge_commands(commands)
        if merged:
            await self._run(lambda conn: _in_transaction(conn, outbox.put, merged))

    async def list_commands(self, *, limit: int = 100) -> list[ChildCommand]:
        """Pending commands, oldest first (``created_at``, then the key), at most ``limit``."""
        if limit < 1:
            return []
        return await self._run(lambda conn: outbox.list_commands(conn, limit))

    async def record_attempt(self, command: ChildCommand) -> None:
        """Count a failed delivery attempt; a no-op when the command is gone."""
        await self._run(lambda conn: _in_transaction(conn, outbox.record_attempt, command))

    async def delete_command(self, command: ChildCommand) -> None:
        """Drop a delivered command; a no-op when it is gone."""
        await self._run(lambda conn: _in_transaction(conn, outbox.delete, command))

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        """Take or renew the lease if it is free, lapsed or already ``owner``'s.

        Raises:
            SessionNotFound: no such session.
        """
        return await self._run(lambda conn: _acquire_lease(conn, session_id, owner, ttl_s))

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        """``acquire_lease`` for every id, in one transaction: the ids whose lease
        ``owner`` holds now (a missing session is not held)."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        return await self._run(lambda conn: _renew_leases(conn, ids, owner, ttl_s))

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        sql = (
            "UPDATE sessions SET owner = '', lease_expires_at = 0 "
            "WHERE session_id = ? AND owner = ?"
        )
        await self._run(lambda conn: _write(conn, sql, (session_id, owner)))

    async def aclose(self) -> None:
        """Close the connection and stop the worker thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            # Queued behind any call still running, so those finish first.
            await self._worker.run(functools.partial(self._call, lambda conn: conn.close()))
        finally:
            self._worker.stop()
            if self._checkpointer is not None:
                await self._checkpointer.aclose()

    async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._closed:
            raise UsageError("SqliteStore is closed")
        # If the caller is cancelled the worker still finishes the transaction:
        # it commits or rolls back as a whole, never half.
        return await self._worker.run(functools.partial(self._call, fn))

    def _call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        with _map_sqlite_errors():
            return fn(self._conn)


_Job = tuple[Callable[[], Any], "asyncio.Future[Any]"]
_BATCH_MAX = 64
"""Calls per loop wake-up at most, so a steady queue cannot hold results back."""
_STARVED_S = 0.0005
"""A worker without progress this long while calls wait is likely waiting for the GIL.
Checked this often, a parent forwarding 10,000 child events stored them fast enough to
cut two hops from 125 to 104 ms (median of 15 alternating runs; 20 ms before)."""
_HANDOFF_S = 0.00005
"""How long the loop then sleeps, letting the worker take the GIL and get on (enough for
a waiting thread to wake; the loop gives up at most a tenth of its time while starved)."""


class _Worker:
    """One thread running submitted calls in order, waking the event loop once per batch.

    ``run_in_executor`` costs a thread wake-up and a loop wake-up (a self-pipe write,
    which drops and re-takes the GIL) per call; with hundreds of sessions each making
    store calls, this worker drains everything queued while it was busy and delivers
    all those results in one ``call_soon_threadsafe``.

    The worker re-takes the GIL after every SQLite statement, and CPython lets a busy
    event loop starve it: each time the loop polls (dropping the GIL for microseconds
    and taking it straight back) the worker's wait starts over, so it never asks the
    loop to switch. With the loop never idle, single appends took up to 40 s. So while
    calls are pending the loop checks every ``_STARVED_S``, and when the worker has
    made no progress that long it sleeps ``_HANDOFF_S`` so the worker can take the GIL.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._pending = 0
        """Calls submitted and not yet returned to their caller (loop thread only)."""
        self._progress_at = 0.0
        """When the worker last started or finished a call, or was handed one while idle."""
        self._watched: asyncio.AbstractEventLoop | None = None
        """The loop whose timer checks on the worker while calls are pending."""
        # Daemon: a store never closed must not hang interpreter exit; a transaction cut
        # off by exit is rolled back by SQLite, never half-written.
        self._thread = threading.Thread(target=self._serve, name="helix-sqlite", daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the worker thread; a cancelled caller does not stop it."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_T] = loop.create_future()
        self._jobs.put((fn, done))
        if not self._pending:
            self._progress_at = time.monotonic()
        self._pending += 1
        if self._watched is not loop:  # none yet, or one on a loop that has since closed
            self._watched = loop
            loop.call_later(_STARVED_S, self._watch, loop)
        try:
            return await done
        finally:
            self._pending -= 1

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._pending or self._watched is not loop:
            if self._watched is loop:
                self._watched = None
            return
        if time.monotonic() - self._progress_at > _STARVED_S:
            time.sleep(_HANDOFF_S)  # a GIL hand-off (see the class docstring), not a wait
        loop.call_later(_STARVED_S, self._watch, loop)

    def stop(self) -> None:
        """Let the thread end once the calls queued before this one have run."""
        self._jobs.put(None)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            batch: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
            while job is not None:
                fn, done = job
                self._progress_at = time.monotonic()
                try:
                    batch.append((done, fn(), None))
                except BaseException as exc:  # delivered to the caller, like an executor
                    batch.append((done, None, exc))
                self._progress_at = time.monotonic()
                if len(batch) >= _BATCH_MAX:  # under constant load, deliver what is done
                    break
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
            loops = {done.get_loop() for done, _, _ in batch}
            for loop in loops:
                with suppress(RuntimeError):  # that loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(
                        _deliver, [b for b in batch if b[0].get_loop() is loop]
                    )
            if job is None:
                return


def _deliver(batch: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for done, result, exc in batch:
        if done.done():  # its caller was cancelled
            continue
        if exc is None:
            done.set_result(result)
        else:
            done.set_exception(exc)


# Everything below runs on the store's worker thread.


def _start_checkpointer(conn: sqlite3.Connection, path: str) -> Checkpointer:
    with _map_sqlite_errors():
        return Checkpointer.start(conn, path)


def _connect(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    if path != ":memory:":
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create the directory for {path!r}: {exc}") from exc
    with _map_sqlite_errors():
        # isolation_level=None: we issue BEGIN/COMMIT ourselves, so the module's
        # implicit transactions cannot split or widen ours.
        conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable in WAL mode except for the last commits on power loss.
            conn.execute("PRAGMA synchronous = NORMAL")
            _ensure_schema(conn)
            for statement in _APPEND_VIEW:
                conn.execute(statement)
        except BaseException:
            conn.close()
            raise
    return conn


def _ensure_schema(conn: sqlite3.Connection) -> None:
    # In one write transaction so two processes opening a new file don't race.
    with _transaction(conn):
        # Not executescript(): it would COMMIT the transaction we are in.
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        version = row[0]
        if version is not None and version > SCHEMA_VERSION:
            raise StoreError(
                f"the database has schema version {version}; this helix-mesh "
                f"understands up to {SCHEMA_VERSION}: upgrade helix-mesh"
            )
        # A new file has just been given the version 1 schema: upgrade it like an old one.
        for target in range((version or 1) + 1, SCHEMA_VERSION + 1):
            for statement in _UPGRADES[target]:
                conn.execute(statement)
        if version != SCHEMA_VERSION:
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))


def _write(conn: sqlite3.Connection, sql: str, params: Any) -> None:
    with _transaction(conn):
        conn.execute(sql, params)


def _in_transaction(
    conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection, _A], None], arg: _A
) -> None:
    with _transaction(conn):
        fn(conn, arg)


def _get_session(conn: sqlite3.Connection, session_id: str) -> SessionRecord | None:
    row = conn.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return None if row is None else _session_from_row(row)


def _require_session(conn: sqlite3.Connection, session_id: str) -> SessionRecord:
    record = _get_session(conn, session_id)
    if record is None:
        raise SessionNotFound(session_id)
    return record


def _create_session(
    conn: sqlite3.Connection, record: SessionRecord, lease_ttl_s: float | None
) -> tuple[SessionRecord, bool]:
    if lease_ttl_s is not None:  # the clock acquire_lease judges by: this process's
        record = dataclasses.replace(record, lease_expires_at=time.time() + lease_ttl_s)
    with _transaction(conn):
        created = conn.execute(_INSERT_SESSION, _session_params(record)).rowcount == 1
        return _require_session(conn, record.session_id), created


def _update_session(
    conn: sqlite3.Connection,
    session_id: str,
    update: SessionUpdate,
    expected_status: SessionStatus | None,
) -> SessionRecord | None:
    with _transaction(conn):
        record = _require_session(conn, session_id)
        if expected_status is not None and record.status != expected_status:
            return None
        record = update.apply(record, now=time.time())
        conn.execute(_WRITE_STATE, _session_params(record))
        return record


@dataclasses.dataclass(frozen=True)
class _Append:
    session_id: str
    events: Sequence[StreamEvent]
    expected_sequence: int
    update: SessionUpdate | None
    encoded: Sequence[bytes] | None
    checkpoint: _CheckpointParams | None
    done: asyncio.Future[int]


def _read_events(conn: sqlite3.Connection, params: tuple[str, int, int]) -> str:
    (joined,) = conn.execute(_READ_EVENTS, params).fetchone()
    return joined or ""


def _parse_events(joined: str) -> list[StreamEvent]:
    if not joined:
        return []
    events = [StreamEvent.FromString(bytes.fromhex(data)) for data in joined.split(",")]
    # group_concat keeps the subquery's order in practice, not by contract: check it.
    if any(a.sequence >= b.sequence for a, b in itertools.pairwise(events)):
        events.sort(key=lambda event: event.sequence)
    return events


def _append_batch(conn: sqlite3.Connection, *, batch: list[_Append]) -> list[int | Exception]:
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
    except _UNBINDABLE:
        if len(batch) == 1:
            raise
    # An error found only by SQLite itself (a value it cannot bind, a full disk) rolled
    # the whole batch back: redo it append by append, so that it fails only its own.
    results: list[int | Exception] = []
    for item, sequences in zip(batch, previous, strict=True):
        try:
            results += _append_items(conn, [item], [sequences], [])
        except _UNBINDABLE as exc:
            results.append(_store_error(exc))
    return results


def _append_items(
    conn: sqlite3.Connection,
    batch: list[_Append],
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
            with _transaction(conn):
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
    batch: list[_Append],
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


def _plain_appends(batch: list[_Append]) -> list[int]:
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
    checkpoint: _CheckpointParams | None = None,
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
            _write_checkpoint(conn, checkpoint)
            return last
        row = conn.execute(_LAST_SEQUENCE, (session_id,)).fetchone()
        if row is None:
            raise SessionNotFound(session_id)
        raise SequenceConflict(session_id, expected_sequence, row[0])
    record = _require_session(conn, session_id)
    last = _insert_events(
        conn, session_id, events, expected_sequence, record.last_sequence, encoded
    )
    record = update.apply(record, now=time.time())
    conn.execute(_WRITE_STATE, _session_params(dataclasses.replace(record, last_sequence=last)))
    _write_checkpoint(conn, checkpoint)  # check_checkpoint made sure it is at ``last``
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
    for data in encoded:
        last += 1
        params += (session_id, last, data)
    return last


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


def _save_checkpoint(conn: sqlite3.Connection, checkpoint: Checkpoint) -> None:
    with _transaction(conn):
        row = conn.execute(
            "SELECT last_sequence FROM sessions WHERE session_id = ?", (checkpoint.session_id,)
        ).fetchone()
        if row is not None and row[0] != checkpoint.last_sequence:
            raise SequenceConflict(checkpoint.session_id, checkpoint.last_sequence, row[0])
        _write_checkpoint(conn, _checkpoint_params(checkpoint))


_CheckpointParams = tuple[str, int, str, str, int, str]
"""A checkpoint as the row that stores it."""


def _checkpoint_params(checkpoint: Checkpoint) -> _CheckpointParams:
    """The checkpoint's row; raises (``TypeError``) when it is not JSON."""
    return (
        checkpoint.session_id,
        checkpoint.step,
        json.dumps(checkpoint.messages),
        json.dumps(dataclasses.asdict(checkpoint.usage)),
        checkpoint.last_sequence,
        json.dumps(checkpoint.state),
    )


def _write_checkpoint(conn: sqlite3.Connection, params: _CheckpointParams | None) -> None:
    """Replace the session's checkpoint, inside the caller's transaction."""
    if params is not None:
        conn.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)", params)


def _load_checkpoint(conn: sqlite3.Connection, session_id: str) -> Checkpoint | None:
    sql = "SELECT * FROM checkpoints WHERE session_id = ?"
    row = conn.execute(sql, (session_id,)).fetchone()
    if row is None:
        return None
    fields = dict(zip(row.keys(), row, strict=True))
    for name in ("messages", "state"):
        fields[name] = json.loads(fields[name])
    fields["usage"] = Usage(**json.loads(fields["usage"]))
    return Checkpoint(**fields)


def _take_interrupt(conn: sqlite3.Connection, session_id: str) -> str | None:
    with _transaction(conn):
        sql = "SELECT reason FROM interrupts WHERE session_id = ?"
        row = conn.execute(sql, (session_id,)).fetchone()
        if row is None:
            return None
        conn.execute("DELETE FROM interrupts WHERE session_id = ?", (session_id,))
        reason: str = row["reason"]
        return reason


def _acquire_lease(conn: sqlite3.Connection, session_id: str, owner: str, ttl_s: float) -> bool:
    with _transaction(conn):
        now = time.time()
        params = {"session_id": session_id, "owner": owner, "now": now, "expires": now + ttl_s}
        if conn.execute(_ACQUIRE_LEASE, params).rowcount == 1:
            return True
        _require_session(conn, session_id)
        return False


def _pending_interrupts(conn: sqlite3.Connection, ids: list[str]) -> set[str]:
    room = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    pending: set[str] = set()
    for start in range(0, len(ids), room):
        part = ids[start : start + room]
        marks = ", ".join("?" * len(part))
        sql = f"SELECT session_id FROM interrupts WHERE session_id IN ({marks})"
        pending.update(row[0] for row in conn.execute(sql, part))
    return pending


def _renew_leases(conn: sqlite3.Connection, ids: list[str], owner: str, ttl_s: float) -> set[str]:
    # Set-based, as appends are: a statement per session made 500 sessions' renewal
    # 500 transactions, each waiting on the busy loop for the GIL.
    room = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - 4
    parts = [ids[start : start + room] for start in range(0, len(ids), room)]
    with _transaction(conn):
        now = time.time()
        expires = now + ttl_s
        taken = 0
        for part in parts:
            marks = ", ".join("?" * len(part))
            sql = (
                "UPDATE sessions SET owner = ?, lease_expires_at = ? "
                f"WHERE session_id IN ({marks}) "
                "AND (owner = '' OR owner = ? OR lease_expires_at <= ?)"
            )
            taken += conn.execute(sql, (owner, expires, *part, owner, now)).rowcount
        if taken == len(ids):
            return set(ids)
        held: set[str] = set()
        for part in parts:  # which ones: one row per statement, not one per session
            marks = ", ".join("?" * len(part))
            sql = (
                "SELECT group_concat(session_id, char(31)) FROM sessions "
                f"WHERE session_id IN ({marks}) AND owner = ? AND lease_expires_at = ?"
            )
            (joined,) = conn.execute(sql, (*part, owner, expires)).fetchone()
            held.update(joined.split("\x1f") if joined else ())
        return held


def _session_params(record: SessionRecord) -> dict[str, Any]:
    params = {name: getattr(record, name) for name in _SESSION_COLUMNS}
    params["status"] = record.status.value
    params["metadata"] = json.dumps(record.metadata)
    params["usage"] = json.dumps(dataclasses.asdict(record.usage))
    return params


def _session_from_row(row: sqlite3.Row) -> SessionRecord:
    fields = {name: row[name] for name in _SESSION_COLUMNS}
    fields["status"] = SessionStatus(row["status"])
    fields["metadata"] = json.loads(row["metadata"])
    fields["usage"] = Usage(**json.loads(row["usage"]))
    return SessionRecord(**fields)


def _ref_params(ref: SubSessionRef) -> dict[str, Any]:
    params = {f.name: getattr(ref, f.name) for f in dataclasses.fields(ref)}
    remote = params.pop("remote")
    params["status"] = ref.status.value
    params["remote_stream_id"] = None if remote is None else remote.stream_id
    params["remote_last_sequence"] = None if remote is None else remote.last_sequence
    return params


def _ref_from_row(row: sqlite3.Row) -> SubSessionRef:
    fields = {name: row[name] for name in _REF_COLUMNS}
    stream_id = fields.pop("remote_stream_id")
    remote_last_sequence = fields.pop("remote_last_sequence")
    fields["status"] = SessionStatus(row["status"])
    fields["remote"] = (
        None
        if stream_id is None
        else RemoteCursor(stream_id=stream_id, last_sequence=remote_last_sequence)
    )
    return SubSessionRef(**fields)
