"""``SqliteStore``: the ``Store`` methods, each run on the store's worker thread."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable, Sequence
from typing import TypeVar

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    StoreError,
    UsageError,
)
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store._base import (
    READ_LIMIT,
    appended_count,
    check_checkpoint,
    check_lease,
    check_page,
    given_bytes,
    storable_answer,
)
from helix_transport.store._listing import SessionPage, SessionQuery
from helix_transport.store._records import (
    Checkpoint,
    ChildCommand,
    Interrupt,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    merge_commands,
    storable_text,
)
from helix_transport.store._retention import Candidate, Tombstone
from helix_transport.store.sqlite import _inputs as inputs
from helix_transport.store.sqlite import _listing as listing
from helix_transport.store.sqlite import _outbox as outbox
from helix_transport.store.sqlite import _retention as retention
from helix_transport.store.sqlite._checkpointer import Checkpointer
from helix_transport.store.sqlite._checkpoints import (
    checkpoint_params,
    load_checkpoint,
    save_checkpoint,
)
from helix_transport.store.sqlite._conn import in_transaction, map_sqlite_errors, write
from helix_transport.store.sqlite._log import (
    Append,
    append_batch,
    parse_events,
    read_encoded,
    read_events,
    split_encoded,
)
from helix_transport.store.sqlite._refs import PUT_REF, ref_from_row, ref_params
from helix_transport.store.sqlite._schema import connect, start_checkpointer
from helix_transport.store.sqlite._sessions import (
    acquire_lease,
    create_session,
    get_session,
    pending_interrupts,
    renew_leases,
    session_from_row,
    update_session,
)
from helix_transport.store.sqlite._worker import Worker

_T = TypeVar("_T")


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
        worker: Worker,
        checkpointer: Checkpointer | None = None,
    ) -> None:
        """Wrap ``conn``, which must have been opened on ``worker``'s thread.

        Prefer ``SqliteStore.open``; the store owns all three and closes them.
        """
        self._conn = conn
        self._worker = worker
        self._checkpointer = checkpointer
        self._closed = False
        self._appends: list[Append] = []
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
        worker = Worker()
        try:
            conn = await worker.run(functools.partial(connect, path, busy_timeout_s))
        except BaseException:
            worker.stop()
            raise
        checkpointer = None
        if path != ":memory:":  # an in-memory database has no log
            try:
                checkpointer = await worker.run(functools.partial(start_checkpointer, conn, path))
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
        return await self._run(lambda conn: create_session(conn, record, lease_ttl_s))

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when it does not exist."""
        return await self._run(lambda conn: get_session(conn, session_id))

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
            lambda conn: update_session(conn, session_id, update, expected_status)
        )

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        """Sessions in ``status``, oldest first."""
        sql = "SELECT * FROM sessions WHERE status = ? ORDER BY created_at, session_id"
        return await self._run(
            lambda conn: [session_from_row(r) for r in conn.execute(sql, (status.value,))]
        )

    async def query_sessions(self, query: SessionQuery, *, limit: int) -> SessionPage:
        """The sessions ``query`` matches, newest first, from the owner index."""
        return await self._run(lambda conn: listing.query_sessions(conn, query, limit))

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
            Append(
                session_id,
                events,
                expected_sequence,
                update,
                encoded,
                # Serialized here, not in the batch: a checkpoint that cannot be stored
                # fails its own append, not every append sharing its transaction.
                None if checkpoint is None else checkpoint_params(checkpoint),
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
                    results = await self._run(functools.partial(append_batch, batch=batch))
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
        return parse_events(await self._run(lambda conn: read_events(conn, params)))

    async def read_encoded(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[bytes]:
        """``read``'s page as the bytes stored (see ``EncodedEventReader``)."""
        limit = max(min(limit, READ_LIMIT), 0)
        row = await self._run(lambda conn: read_encoded(conn, session_id, from_sequence, limit))
        # Split here, not on the worker, for the reason ``read`` parses here.
        encoded = split_encoded(row, from_sequence)
        if encoded is None:  # not in order: as ``read`` has them, sorted
            events = await self.read(session_id, from_sequence=from_sequence, limit=limit)
            check_page(session_id, from_sequence, [event.sequence for event in events])
            encoded = [event.SerializeToString() for event in events]
        return encoded

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the session's checkpoint, fenced by the log's end (see ``Store``)."""
        await self._run(lambda conn: save_checkpoint(conn, checkpoint))

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's latest checkpoint, or ``None``."""
        return await self._run(lambda conn: load_checkpoint(conn, session_id))

    async def set_interrupt(self, session_id: str, reason: str, *, abort: bool = False) -> None:
        """Record an interrupt request; a later one replaces an untaken one, but a plain
        interrupt never replaces an abort."""
        text = storable_text(reason)
        await self._run(lambda conn: inputs.set_interrupt(conn, session_id, text, abort))

    async def take_interrupt(self, session_id: str) -> Interrupt | None:
        """Read and clear the session's interrupt request."""
        return await self._run(lambda conn: inputs.take_interrupt(conn, session_id))

    async def put_answer(
        self, session_id: str, request_id: str, answer_json: str
    ) -> tuple[str, bool]:
        """Record the answer unless the request has one, in one transaction (see
        ``InputStore``)."""
        answer = storable_answer(request_id, answer_json)
        return await self._run(lambda conn: inputs.put_answer(conn, session_id, request_id, answer))

    async def list_answers(self, session_id: str) -> dict[str, str]:
        """The session's answers by request id."""
        return await self._run(lambda conn: inputs.list_answers(conn, session_id))

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` with an untaken interrupt request."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        return await self._run(lambda conn: pending_interrupts(conn, ids))

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        """Insert or replace the ref keyed by (parent, child session id)."""
        await self._run(lambda conn: write(conn, PUT_REF, ref_params(ref)))

    async def list_subsession_refs(self, parent_session_id: str) -> list[SubSessionRef]:
        """The parent's refs, in the order they were first stored."""
        sql = "SELECT * FROM subsession_refs WHERE parent_session_id = ? ORDER BY position"
        return await self._run(
            lambda conn: [ref_from_row(r) for r in conn.execute(sql, (parent_session_id,))]
        )

    async def get_subsession_ref(
        self, parent_session_id: str, child_session_id: str
    ) -> SubSessionRef | None:
        """The ref keyed by (parent, child session id), or ``None``."""
        sql = "SELECT * FROM subsession_refs WHERE parent_session_id = ? AND child_session_id = ?"

        def get(conn: sqlite3.Connection) -> SubSessionRef | None:
            row = conn.execute(sql, (parent_session_id, child_session_id)).fetchone()
            return None if row is None else ref_from_row(row)

        return await self._run(get)

    async def put_commands(self, commands: Sequence[ChildCommand]) -> None:
        """Record ``commands`` in one transaction (an upsert keeping the first
        ``created_at``; see ``Store``)."""
        merged = merge_commands(commands)
        if merged:
            await self._run(lambda conn: in_transaction(conn, outbox.put, merged))

    async def list_commands(self, *, limit: int = 100) -> list[ChildCommand]:
        """Pending commands, oldest first (``created_at``, then the key), at most ``limit``."""
        if limit < 1:
            return []
        return await self._run(lambda conn: outbox.list_commands(conn, limit))

    async def record_attempt(self, command: ChildCommand) -> None:
        """Count a failed delivery attempt; a no-op when the command is gone."""
        await self._run(lambda conn: in_transaction(conn, outbox.record_attempt, command))

    async def delete_command(self, command: ChildCommand) -> None:
        """Drop a delivered command; a no-op when it is gone."""
        await self._run(lambda conn: in_transaction(conn, outbox.delete, command))

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        """Take or renew the lease if it is free, lapsed or already ``owner``'s.

        Raises:
            SessionNotFound: no such session.
        """
        return await self._run(lambda conn: acquire_lease(conn, session_id, owner, ttl_s))

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        """``acquire_lease`` for every id, in one transaction: the ids whose lease
        ``owner`` holds now (a missing session is not held)."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        return await self._run(lambda conn: renew_leases(conn, ids, owner, ttl_s))

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        sql = (
            "UPDATE sessions SET owner = '', lease_expires_at = 0 "
            "WHERE session_id = ? AND owner = ?"
        )
        await self._run(lambda conn: write(conn, sql, (session_id, owner)))

    async def finished_sessions(
        self, *, finished_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[SessionRecord]:
        """Finished sessions ended by ``finished_before``, oldest end first (``RetentionStore``)."""
        return await self._run(
            lambda conn: retention.finished_sessions(conn, finished_before, after, limit)
        )

    async def expire_sessions(
        self, candidates: Sequence[Candidate], *, finished_before: float, keep_tombstone_s: float
    ) -> list[str]:
        """Remove the candidates the rule still allows, in one transaction."""
        return await self._run(
            lambda conn: retention.expire(conn, candidates, finished_before, keep_tombstone_s)
        )

    async def get_tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of an expired session, while it is kept."""
        return await self._run(lambda conn: retention.get_tombstone(conn, session_id))

    async def drop_tombstones(self, *, kept_until: float, limit: int) -> int:
        """Remove up to ``limit`` tombstones kept until ``kept_until`` or before."""
        return await self._run(lambda conn: retention.drop_tombstones(conn, kept_until, limit))

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
        with map_sqlite_errors():
            return fn(self._conn)
