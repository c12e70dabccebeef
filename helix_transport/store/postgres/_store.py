"""``PostgresStore``: the role modules composed into one ``Store``.

Each role (``_sessions``, ``_log``, ``_notifier``, ``_checkpoints``, ``_leases``,
``_interrupts``, ``_inputs``, ``_refs``, ``_outbox``, ``_listing``, ``_retention``) is
an object on the store's ``Database`` (``_conn``: the pool, the schema and the one
boundary for the driver's errors) that implements that role's protocol; the schema's
migrations are ``_schema``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg  # type: ignore[import-untyped]

from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store._base import READ_LIMIT
from helix_transport.store._listing import SessionPage, SessionQuery
from helix_transport.store._records import (
    Checkpoint,
    ChildCommand,
    Interrupt,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
)
from helix_transport.store._retention import Candidate, Tombstone
from helix_transport.store.postgres._checkpoints import PostgresCheckpoints
from helix_transport.store.postgres._conn import Database
from helix_transport.store.postgres._errors import check_schema, describe_dsn, map_pg_errors
from helix_transport.store.postgres._inputs import PostgresInputs
from helix_transport.store.postgres._interrupts import PostgresInterrupts
from helix_transport.store.postgres._leases import PostgresLeases
from helix_transport.store.postgres._listing import PostgresSessionIndex
from helix_transport.store.postgres._log import PostgresEventLog
from helix_transport.store.postgres._notifier import PostgresNotifier
from helix_transport.store.postgres._outbox import PostgresOutbox
from helix_transport.store.postgres._refs import PostgresChildRefs
from helix_transport.store.postgres._retention import PostgresRetention
from helix_transport.store.postgres._schema import migrate
from helix_transport.store.postgres._sessions import PostgresSessions

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
        check_schema(schema)
        self._pool = pool
        self._db = db = Database(pool, schema, acquire_timeout_s)
        self._owns_pool = False
        self._sessions = PostgresSessions(db)
        self._index = PostgresSessionIndex(db)
        self._log = PostgresEventLog(db, self.channel)
        self._notifier = PostgresNotifier(db, self.channel)
        self._checkpoints = PostgresCheckpoints(db)
        self._leases = PostgresLeases(db)
        self._interrupts = PostgresInterrupts(db)
        self._inputs = PostgresInputs(db)
        self._refs = PostgresChildRefs(db)
        self._outbox = PostgresOutbox(db)
        self._retention = PostgresRetention(db)

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
        check_schema(schema)  # before connecting: a bad name is not worth a round trip
        where = describe_dsn(dsn)
        with map_pg_errors(where, connecting=True):
            pool = await asyncpg.create_pool(
                dsn, min_size=min_size, max_size=max_size, timeout=connect_timeout_s
            )
        store = cls(pool, schema=schema, acquire_timeout_s=acquire_timeout_s)
        store._db.where, store._owns_pool = where, True
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
        return f"{self._db.schema}_events"

    async def migrate(self) -> None:
        """Create the schema if needed and apply the migrations it lacks, in order.

        Safe to run from many processes at once: the work happens in one
        transaction under an advisory lock, so exactly one of them migrates. A
        schema with a migration newer than this module knows raises ``StoreError``.
        """
        async with self._db.transaction() as conn:
            await migrate(conn, self._db.schema, self._db.quoted)

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pool if the store owns it (an injected one stays open). Idempotent."""
        if self._db.closed:
            return
        self._db.closed = True
        await self._notifier.aclose()
        if not self._owns_pool:
            return
        try:
            # close() waits for calls still holding connections to finish.
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await self._pool.close()
        except TimeoutError:
            self._pool.terminate()

    # SessionStore, SessionIndex

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        """Create ``record`` unless its id exists (see ``Store.create_session``)."""
        return await self._sessions.create_session(record, lease_ttl_s=lease_ttl_s)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when it does not exist."""
        return await self._sessions.get_session(session_id)

    async def update_session(
        self,
        session_id: str,
        update: SessionUpdate,
        *,
        expected_status: SessionStatus | None = None,
    ) -> SessionRecord | None:
        """Apply ``update``, optionally only while the status matches (see ``Store``)."""
        return await self._sessions.update_session(
            session_id, update, expected_status=expected_status
        )

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        """Sessions in ``status``, oldest first."""
        return await self._sessions.list_sessions(status=status)

    async def query_sessions(self, query: SessionQuery, *, limit: int) -> SessionPage:
        """The sessions ``query`` matches, newest first, from the owner index."""
        return await self._index.query_sessions(query, limit=limit)

    # EventLogStore, EventNotifier

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
        """Append ``events`` in one statement, assigning their sequences (see ``Store.append``)."""
        return await self._log.append(
            session_id,
            events,
            expected_sequence=expected_sequence,
            update=update,
            encoded=encoded,
            checkpoint=checkpoint,
        )

    async def read(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[StreamEvent]:
        """Up to ``limit`` (at most ``READ_LIMIT``) events after ``from_sequence``."""
        return await self._log.read(session_id, from_sequence=from_sequence, limit=limit)

    async def read_encoded(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[bytes]:
        """``read``'s page as the bytes stored (see ``EncodedEventReader``)."""
        return await self._log.read_encoded(session_id, from_sequence=from_sequence, limit=limit)

    async def wait_for_events(
        self, session_id: str, *, from_sequence: int, timeout_s: float
    ) -> bool:
        """Wait for a ``NOTIFY`` about ``session_id`` (sent by every committed append)."""
        return await self._notifier.wait_for_events(
            session_id, from_sequence=from_sequence, timeout_s=timeout_s
        )

    # CheckpointStore

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the session's checkpoint, fenced by the log's end (see ``Store``)."""
        await self._checkpoints.save_checkpoint(checkpoint)

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's latest checkpoint, or ``None``."""
        return await self._checkpoints.load_checkpoint(session_id)

    # InterruptStore, InterruptLookup, InputStore

    async def set_interrupt(self, session_id: str, reason: str, *, abort: bool = False) -> None:
        """Record an interrupt request; a later one replaces an untaken one, but a plain
        interrupt never replaces an abort."""
        await self._interrupts.set_interrupt(session_id, reason, abort=abort)

    async def take_interrupt(self, session_id: str) -> Interrupt | None:
        """Read and clear the session's interrupt request in one statement."""
        return await self._interrupts.take_interrupt(session_id)

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` with an untaken interrupt request."""
        return await self._interrupts.pending_interrupts(session_ids)

    async def put_answer(
        self, session_id: str, request_id: str, answer_json: str
    ) -> tuple[str, bool]:
        """Record the answer unless the request has one (see ``InputStore``)."""
        return await self._inputs.put_answer(session_id, request_id, answer_json)

    async def list_answers(self, session_id: str) -> dict[str, str]:
        """The session's answers by request id."""
        return await self._inputs.list_answers(session_id)

    # ChildRefStore

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        """Insert or replace the ref keyed by (parent, child session id)."""
        await self._refs.put_subsession_ref(ref)

    async def list_subsession_refs(self, parent_session_id: str) -> list[SubSessionRef]:
        """The parent's refs, in the order they were first stored."""
        return await self._refs.list_subsession_refs(parent_session_id)

    async def get_subsession_ref(
        self, parent_session_id: str, child_session_id: str
    ) -> SubSessionRef | None:
        """The ref keyed by (parent, child session id), or ``None``."""
        return await self._refs.get_subsession_ref(parent_session_id, child_session_id)

    # OutboxStore

    async def put_commands(self, commands: Sequence[ChildCommand]) -> None:
        """Record ``commands`` in one statement (an upsert keeping the first
        ``created_at``; see ``Store``)."""
        await self._outbox.put_commands(commands)

    async def list_commands(self, *, limit: int = 100) -> list[ChildCommand]:
        """Pending commands, oldest first (``created_at``, then the key), at most ``limit``."""
        return await self._outbox.list_commands(limit=limit)

    async def record_attempt(self, command: ChildCommand) -> None:
        """Count a failed delivery attempt; a no-op when the command is gone."""
        await self._outbox.record_attempt(command)

    async def delete_command(self, command: ChildCommand) -> None:
        """Drop a delivered command; a no-op when it is gone."""
        await self._outbox.delete_command(command)

    # LeaseStore

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        """Take or renew the lease if it is free, lapsed or already ``owner``'s, by the
        database's clock (replicas whose clocks disagree still agree on who holds it)."""
        return await self._leases.acquire_lease(session_id, owner, ttl_s=ttl_s)

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        """``acquire_lease`` for every id in one statement: the ids ``owner`` holds now."""
        return await self._leases.renew_leases(session_ids, owner, ttl_s=ttl_s)

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        await self._leases.release_lease(session_id, owner)

    # RetentionStore

    async def finished_sessions(
        self, *, finished_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[SessionRecord]:
        """Finished sessions ended by ``finished_before``, oldest end first (``RetentionStore``)."""
        return await self._retention.finished_sessions(
            finished_before=finished_before, after=after, limit=limit
        )

    async def expire_sessions(
        self, candidates: Sequence[Candidate], *, finished_before: float, keep_tombstone_s: float
    ) -> list[str]:
        """Remove the candidates the rule still allows, in one transaction."""
        return await self._retention.expire_sessions(
            candidates, finished_before=finished_before, keep_tombstone_s=keep_tombstone_s
        )

    async def get_tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of an expired session, while it is kept."""
        return await self._retention.get_tombstone(session_id)

    async def drop_tombstones(self, *, kept_until: float, limit: int) -> int:
        """Remove up to ``limit`` tombstones kept until ``kept_until`` or before."""
        return await self._retention.drop_tombstones(kept_until=kept_until, limit=limit)
