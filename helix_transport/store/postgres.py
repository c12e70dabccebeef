"""The shared durable store: PostgreSQL through an ``asyncpg`` pool.

Everything lives in one schema (``helix`` by default), so several deployments or
test runs can share a database. The schema is created and upgraded on open by
numbered migrations, applied under a transaction-scoped advisory lock so replicas
starting together migrate it exactly once. Every ``Store`` method is one statement
or one transaction; ``append`` locks the session row, so sequences are assigned by
the database and two writers can never interleave a log.

Timestamps are seconds since the epoch in ``double precision`` columns, so floats
round-trip exactly. Leases are the exception to "the caller's clock": they are
granted and checked against the database clock, which all replicas share.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from helix_transport._optional import requires

with requires("postgres", "the PostgreSQL store (postgresql://)"):
    import asyncpg  # type: ignore[import-untyped]

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    SequenceConflict,
    SessionNotFound,
    StoreUnavailable,
    UsageError,
)
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store import _postgres_inputs as inputs
from helix_transport.store import _postgres_listing as listing
from helix_transport.store import _postgres_outbox as outbox
from helix_transport.store import _postgres_retention as retention
from helix_transport.store._base import (
    READ_LIMIT,
    appended_count,
    check_checkpoint,
    check_lease,
    given_bytes,
    storable_answer,
)
from helix_transport.store._listing import SessionPage, SessionQuery, clamp, page_of
from helix_transport.store._postgres_errors import (
    _check_schema,
    _describe_dsn,
    _is_lost,
    _map_pg_errors,
)
from helix_transport.store._postgres_schema import SCHEMA_VERSION, migrate
from helix_transport.store._postgres_sql import (
    _ACQUIRE_LEASE,
    _APPEND_FENCED,
    _APPEND_FENCED_CHECKPOINT,
    _GET_REF,
    _GET_SESSION,
    _INSERT_SESSION,
    _INSERT_SESSION_LEASED,
    _LAST_SEQUENCE,
    _LIST_REFS,
    _LIST_SESSIONS,
    _LOAD_CHECKPOINT,
    _PENDING_INTERRUPTS,
    _PUT_REF,
    _READ,
    _REF_COLUMNS,
    _RELEASE_LEASE,
    _RENEW_LEASES,
    _SAVE_CHECKPOINT,
    _UPDATED_COLUMNS,
    _columns,
    _ref_from_row,
    _session_from_row,
)
from helix_transport.store._records import (
    Checkpoint,
    ChildCommand,
    Interrupt,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    Usage,
    merge_commands,
    storable_text,
)
from helix_transport.store._retention import Candidate, Tombstone

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

_CLOSE_TIMEOUT_S = 10.0


class PostgresStore:
    """A ``Store`` in PostgreSQL, shared by every replica of a service.

    Open it with ``await PostgresStore.open(dsn)``, which creates a pool the store
    owns and closes, or wrap a pool you own with ``PostgresStore(pool)`` and call
    ``await store.migrate()`` once; ``aclose()`` never closes an injected pool.

    After each append the store sends ``NOTIFY`` on ``channel`` with the session id
    as payload (delivered only if the append commits), for live tails to ``LISTEN``.
    """

    def __init__(
        self, pool: asyncpg.Pool, *, schema: str = "helix", acquire_timeout_s: float = 10.0
    ) -> None:
        """Use ``pool``, which the caller keeps owning; run ``migrate()`` before use.

        Args:
            schema: the schema holding the store's tables (a lowercase identifier,
                else ``UsageError``).
            acquire_timeout_s: how long a call waits for a free pooled connection
                before failing with ``StoreUnavailable``.
        """
        _check_schema(schema)
        self._pool = pool
        self._schema = schema
        self._s = f'"{schema}"'
        self._acquire_timeout_s = acquire_timeout_s
        self._where = "the injected pool"
        self._owns_pool = False
        self._closed = False
        # LISTEN state: one pooled connection kept for notifications, and the
        # readers waiting on each session.
        self._listener: Any = None
        self._listener_lock = asyncio.Lock()
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        schema: str = "helix",
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout_s: float = 5.0,
        acquire_timeout_s: float = 10.0,
    ) -> PostgresStore:
        """Connect to ``dsn``, create or upgrade the schema, and own the pool.

        Args:
            dsn: a ``postgresql://user:password@host:port/database`` URL.
            schema: the schema holding the store's tables; created when missing.
            min_size: connections the pool keeps open.
            max_size: connections the pool opens at most.
            connect_timeout_s: how long connecting may take before giving up.
            acquire_timeout_s: see ``PostgresStore.__init__``.

        Raises:
            UsageError: ``dsn`` or ``schema`` is malformed.
            StoreUnavailable: the server cannot be reached or refuses the login,
                or the database does not exist; the message names host and port.
            StoreError: the schema was migrated by a newer helix-mesh.
        """
        _check_schema(schema)  # before connecting: a bad name is not worth a round trip
        where = _describe_dsn(dsn)
        with _map_pg_errors(where, connecting=True):
            pool = await asyncpg.create_pool(
                dsn, min_size=min_size, max_size=max_size, timeout=connect_timeout_s
            )
        store = cls(pool, schema=schema, acquire_timeout_s=acquire_timeout_s)
        store._where, store._owns_pool = where, True
        try:
            await store.migrate()
        except BaseException:
            # terminate(), not close(): it cannot block, even when we are cancelled.
            pool.terminate()
            raise
        return store

    @property
    def channel(self) -> str:
        """The ``NOTIFY`` channel that carries the session id of each append."""
        return f"{self._schema}_events"

    async def migrate(self) -> None:
        """Create the schema if needed and apply the migrations it lacks, in order.

        Safe to run from many processes at once: the work happens in one
        transaction under an advisory lock, so exactly one of them migrates. A
        schema with a migration newer than this module knows raises ``StoreError``.
        """
        async with self._transaction() as conn:
            await migrate(conn, self._schema, self._s)

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        """Create ``record`` unless its id exists (see ``Store.create_session``)."""
        check_lease(record, lease_ttl_s)
        if lease_ttl_s is None:
            row = await self._call("fetchrow", _INSERT_SESSION, *_columns(record).values())
        else:
            values = _columns(record) | {"lease_expires_at": lease_ttl_s}
            row = await self._call("fetchrow", _INSERT_SESSION_LEASED, *values.values())
        if row is not None:
            return _session_from_row(row), True
        # The INSERT waited for a racing creator to commit, so a new statement sees its row.
        existing = await self.get_session(record.session_id)
        if existing is None:
            raise SessionNotFound(record.session_id)
        return existing, False

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when it does not exist."""
        row = await self._call("fetchrow", _GET_SESSION, session_id)
        return None if row is None else _session_from_row(row)

    async def update_session(
        self,
        session_id: str,
        update: SessionUpdate,
        *,
        expected_status: SessionStatus | None = None,
    ) -> SessionRecord | None:
        """Apply ``update``; with ``expected_status``, as one compare-and-set UPDATE."""
        changes = {c: v for c, v in _columns(update).items() if v is not None}
        args: list[Any] = [session_id, *changes.values(), time.time()]
        sets = [f"{c} = ${n}" for n, c in enumerate(changes, start=2)]
        sets.append(f"updated_at = ${len(args)}")
        # SessionUpdate.apply's rule, in SQL: every terminal status stamps finished_at.
        if update.status is not None and update.status.is_terminal:
            sets.append(f"finished_at = ${len(args)}")
        where = "session_id = $1"
        if expected_status is not None:
            args.append(expected_status.value)
            where += f" AND status = ${len(args)}"
        sql = f"UPDATE {{s}}.sessions SET {', '.join(sets)} WHERE {where} RETURNING *"
        row = await self._call("fetchrow", sql, *args)
        if row is not None:
            return _session_from_row(row)
        # Gone (never created, or expired since): not found; else the status differed.
        if await self.get_session(session_id) is None:
            raise SessionNotFound(session_id)
        return None

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        """Sessions in ``status``, oldest first."""
        rows = await self._call("fetch", _LIST_SESSIONS, status.value)
        return [_session_from_row(row) for row in rows]

    async def query_sessions(self, query: SessionQuery, *, limit: int) -> SessionPage:
        """The sessions ``query`` matches, newest first, from the owner index."""
        sql, args = listing.query_sql(query, limit)
        rows = await self._call("fetch", sql, *args) if clamp(limit) else []
        return page_of(listing.records(rows), clamp(limit))

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

        One statement (``_fenced_append``). When the append fails, the events keep
        their previous sequences.
        """
        given = given_bytes(events, encoded)
        check_checkpoint(session_id, checkpoint, expected_sequence, appended_count(events, given))
        previous = [event.sequence for event in events]
        try:
            for sequence, event in enumerate(events, expected_sequence + 1):
                event.sequence = sequence
            data = given if given is not None else [e.SerializeToString() for e in events]
            return await self._append_fenced(
                session_id, expected_sequence, data, update=update, checkpoint=checkpoint
            )
        except BaseException:
            # Nothing was stored, so the caller's events must not claim sequences either.
            for event, sequence in zip(events, previous, strict=True):
                event.sequence = sequence
            raise

    async def _append_fenced(
        self,
        session_id: str,
        expected_sequence: int,
        data: Sequence[bytes],
        *,
        update: SessionUpdate | None,
        checkpoint: Checkpoint | None,
    ) -> int:
        """A fenced append of ``data`` (the events' bytes, numbered from
        ``expected_sequence + 1``) in one statement: see ``_fenced_append``."""
        changes: list[Any] = [None] * len(_UPDATED_COLUMNS)
        if update is not None:
            now = time.time()
            record = _columns(update) | {"updated_at": now, "finished_at": None}
            if update.status is not None and update.status.is_terminal:
                record["finished_at"] = now  # as SessionUpdate.apply stamps it
            changes = [record[c] for c in _UPDATED_COLUMNS]
        args: list[Any] = [session_id, expected_sequence, list(data), *changes]
        if checkpoint is not None:
            args += _columns(checkpoint).values()
        args.append(self.channel)
        template = _APPEND_FENCED if checkpoint is None else _APPEND_FENCED_CHECKPOINT
        row = await self._call("fetchrow", template, *args)
        if row is not None:
            return int(row["last_sequence"])
        last = await self._call("fetchval", _LAST_SEQUENCE, session_id)
        if last is None:
            raise SessionNotFound(session_id)
        raise SequenceConflict(session_id, expected_sequence, last)

    async def read(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[StreamEvent]:
        """Up to ``limit`` (at most ``READ_LIMIT``) events after ``from_sequence``."""
        limit = max(min(limit, READ_LIMIT), 0)
        rows = await self._call("fetch", _READ, session_id, from_sequence, limit)
        return [StreamEvent.FromString(row["data"]) for row in rows]

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the session's checkpoint, fenced by the log's end (see ``Store``)."""
        async with self._transaction() as conn:
            last = await conn.fetchval(
                self._q("SELECT last_sequence FROM {s}.sessions WHERE session_id = $1 FOR SHARE"),
                checkpoint.session_id,
            )
            if last is not None and last != checkpoint.last_sequence:
                raise SequenceConflict(checkpoint.session_id, checkpoint.last_sequence, last)
            await conn.execute(self._q(_SAVE_CHECKPOINT), *_columns(checkpoint).values())

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's latest checkpoint, or ``None``."""
        row = await self._call("fetchrow", _LOAD_CHECKPOINT, session_id)
        if row is None:
            return None
        fields = dict(row.items())
        for name in ("messages", "usage", "state"):
            fields[name] = json.loads(fields[name])
        fields["usage"] = Usage(**fields["usage"])
        return Checkpoint(**fields)

    async def set_interrupt(self, session_id: str, reason: str, *, abort: bool = False) -> None:
        """Record an interrupt request; a later one replaces an untaken one, but a plain
        interrupt never replaces an abort."""
        text = storable_text(reason)
        await self._call("execute", inputs.SET_INTERRUPT, session_id, text, bool(abort))

    async def take_interrupt(self, session_id: str) -> Interrupt | None:
        """Read and clear the session's interrupt request in one statement."""
        return inputs.interrupt(await self._call("fetchrow", inputs.TAKE_INTERRUPT, session_id))

    async def put_answer(
        self, session_id: str, request_id: str, answer_json: str
    ) -> tuple[str, bool]:
        """Record the answer unless the request has one (see ``InputStore``)."""
        answer = storable_answer(request_id, answer_json)
        async with self._connection() as conn:
            return await inputs.put_answer(conn, self._q, session_id, request_id, answer)

    async def list_answers(self, session_id: str) -> dict[str, str]:
        """The session's answers by request id."""
        rows = await self._call("fetch", inputs.LIST_ANSWERS, session_id)
        return {row["request_id"]: row["answer"] for row in rows}

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` with an untaken interrupt request."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        rows = await self._call("fetch", _PENDING_INTERRUPTS, ids)
        return {row["session_id"] for row in rows}

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        """Insert or replace the ref keyed by (parent, child session id)."""
        columns = _columns(ref)
        await self._call("execute", _PUT_REF, *(columns[c] for c in _REF_COLUMNS))

    async def list_subsession_refs(self, parent_session_id: str) -> list[SubSessionRef]:
        """The parent's refs, in the order they were first stored."""
        rows = await self._call("fetch", _LIST_REFS, parent_session_id)
        return [_ref_from_row(row) for row in rows]

    async def get_subsession_ref(
        self, parent_session_id: str, child_session_id: str
    ) -> SubSessionRef | None:
        """The ref keyed by (parent, child session id), or ``None``."""
        row = await self._call("fetchrow", _GET_REF, parent_session_id, child_session_id)
        return None if row is None else _ref_from_row(row)

    async def put_commands(self, commands: Sequence[ChildCommand]) -> None:
        """Record ``commands`` in one statement (an upsert keeping the first
        ``created_at``; see ``Store``)."""
        merged = merge_commands(commands)
        if merged:
            await self._call("execute", outbox.PUT, *outbox.put_args(merged))

    async def list_commands(self, *, limit: int = 100) -> list[ChildCommand]:
        """Pending commands, oldest first (``created_at``, then the key), at most ``limit``."""
        if limit < 1:
            return []
        return [outbox.from_row(row) for row in await self._call("fetch", outbox.LIST, limit)]

    async def record_attempt(self, command: ChildCommand) -> None:
        """Count a failed delivery attempt; a no-op when the command is gone."""
        await self._call("execute", outbox.RECORD_ATTEMPT, *command.key)

    async def delete_command(self, command: ChildCommand) -> None:
        """Drop a delivered command; a no-op when it is gone."""
        await self._call("execute", outbox.DELETE, *command.key)

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        """Take or renew the lease if it is free, lapsed or already ``owner``'s.

        Expiry is set and checked with the database clock, so replicas whose
        clocks disagree still agree on who holds a lease.
        """
        row = await self._call("fetchrow", _ACQUIRE_LEASE, session_id, owner, ttl_s)
        if not row["found"]:
            raise SessionNotFound(session_id)
        return bool(row["taken"])

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        """``acquire_lease`` for every id, in one statement: the ids whose lease
        ``owner`` holds now (a missing session is not held)."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        rows = await self._call("fetch", _RENEW_LEASES, ids, owner, ttl_s)
        return {row["session_id"] for row in rows}

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        await self._call("execute", _RELEASE_LEASE, session_id, owner)

    async def finished_sessions(
        self, *, finished_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[SessionRecord]:
        """Finished sessions ended by ``finished_before``, oldest end first (``RetentionStore``)."""
        args = (finished_before, *retention.after_args(after), max(limit, 0))
        return [_session_from_row(r) for r in await self._call("fetch", retention.FINISHED, *args)]

    async def expire_sessions(
        self, candidates: Sequence[Candidate], *, finished_before: float, keep_tombstone_s: float
    ) -> list[str]:
        """Remove the candidates the rule still allows, in one transaction."""
        async with self._transaction() as conn:
            return await retention.expire(
                conn, self._q, candidates, finished_before, keep_tombstone_s
            )

    async def get_tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of an expired session, while it is kept."""
        row = await self._call("fetchrow", retention.GET_TOMBSTONE, session_id, time.time())
        return retention.tombstone(row)

    async def drop_tombstones(self, *, kept_until: float, limit: int) -> int:
        """Remove up to ``limit`` tombstones kept until ``kept_until`` or before."""
        status = await self._call("execute", retention.DROP_TOMBSTONES, kept_until, max(limit, 0))
        return int(status.rpartition(" ")[2])

    async def wait_for_events(
        self, session_id: str, *, from_sequence: int, timeout_s: float
    ) -> bool:
        """Wait for a ``NOTIFY`` about ``session_id`` (sent by every committed append)."""
        await self._ensure_listener()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(session_id, set()).add(waiter)
        try:
            # An append between the caller's last read and our LISTEN would be missed:
            # look at the log's end once the waiter is registered.
            async with self._connection() as conn:
                last = await conn.fetchval(
                    self._q("SELECT last_sequence FROM {s}.sessions WHERE session_id = $1"),
                    session_id,
                )
            if last is not None and last > from_sequence:
                return True
            try:
                async with asyncio.timeout(timeout_s):
                    await waiter
            except TimeoutError:
                return False
            return True
        finally:
            waiting = self._waiters.get(session_id)
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del self._waiters[session_id]

    async def _ensure_listener(self) -> None:
        if self._listener is not None and not _is_lost(self._listener):
            return
        async with self._listener_lock:
            if self._listener is not None and not _is_lost(self._listener):
                return
            # A lost listener (the server restarted, or ended the connection) is gone
            # from the pool already; LISTEN again on a fresh one. Notices sent meanwhile
            # are missed: waiters fall back on their poll interval.
            self._listener = None
            with _map_pg_errors(self._where):
                conn = await self._pool.acquire(timeout=self._acquire_timeout_s)
                try:
                    await conn.add_listener(self.channel, self._on_notify)
                except BaseException:  # cancelled too: a waiter gave up meanwhile
                    await asyncio.shield(self._pool.release(conn))
                    raise
            self._listener = conn

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        for waiter in self._waiters.get(payload, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def aclose(self) -> None:
        """Close the pool if the store owns it (an injected one stays open). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._listener is not None:
            listener, self._listener = self._listener, None
            with contextlib.suppress(Exception):
                await listener.remove_listener(self.channel, self._on_notify)
                await self._pool.release(listener)
        if not self._owns_pool:
            return
        try:
            # close() waits for calls still holding connections to finish.
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await self._pool.close()
        except TimeoutError:
            self._pool.terminate()

    def _q(self, template: str) -> str:
        return template.replace("{s}", self._s)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        """A pooled connection, with driver errors translated at this one boundary."""
        if self._closed:
            raise UsageError("PostgresStore is closed")
        with _map_pg_errors(self._where):
            try:
                conn = await self._pool.acquire(timeout=self._acquire_timeout_s)
            except TimeoutError as exc:
                raise StoreUnavailable(
                    f"no PostgreSQL connection to {self._where} became free within "
                    f"{self._acquire_timeout_s:g}s (pool exhausted or server unresponsive)"
                ) from exc
            try:
                yield conn
            except asyncpg.InterfaceError as exc:
                # When the server drops a connection, the pool detaches it and later
                # calls fail with InterfaceError ("released back to the pool").
                if _is_lost(conn):
                    raise StoreUnavailable(
                        f"PostgreSQL at {self._where}: lost the connection: {exc}"
                    ) from exc
                raise
            finally:
                # Pool.release shields itself, so a cancelled call still returns the
                # connection (rolled back and reset) instead of leaking it.
                await self._pool.release(conn)

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Any]:
        async with self._connection() as conn:
            # Not `async with conn.transaction()`: on a lost connection its rollback
            # replaces the real error with "the underlying connection is closed".
            transaction = conn.transaction()
            await transaction.start()
            try:
                yield conn
            except BaseException:
                # Best effort: release() resets or terminates the connection anyway,
                # and the error worth reporting is the one that got us here.
                with contextlib.suppress(Exception):
                    await transaction.rollback()
                raise
            await transaction.commit()

    async def _call(self, method: str, template: str, *args: Any) -> Any:
        """One statement on a pooled connection; ``method`` names the asyncpg call."""
        async with self._connection() as conn:
            return await getattr(conn, method)(self._q(template), *args)
