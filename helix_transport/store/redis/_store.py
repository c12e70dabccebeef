"""``RedisStore``: the role modules composed into one ``Store``.

Each role (``_sessions``, ``_log``, ``_checkpoints``, ``_leases``, ``_interrupts``,
``_inputs``, ``_refs``, ``_outbox``, ``_listing``, ``_retention``) is an object that
speaks the driver and implements that role's protocol; the store owns the client,
refuses calls once closed and translates the driver's errors for all of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from helix_transport._events import SessionStatus
from helix_transport._exceptions import StoreError, UsageError
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
from helix_transport.store.redis._checkpoints import RedisCheckpoints
from helix_transport.store.redis._errors import describe_url, map_redis_errors
from helix_transport.store.redis._inputs import RedisInputs
from helix_transport.store.redis._interrupts import RedisInterrupts
from helix_transport.store.redis._leases import RedisLeases
from helix_transport.store.redis._listing import RedisSessionIndex
from helix_transport.store.redis._log import RedisEventLog
from helix_transport.store.redis._outbox import RedisOutbox
from helix_transport.store.redis._persistence import require_persistence, volatile_allowed
from helix_transport.store.redis._refs import RedisChildRefs
from helix_transport.store.redis._retention import RedisRetention
from helix_transport.store.redis._sessions import RedisSessions


class RedisStore:
    """A ``Store`` in Redis, shared by every process that uses the same prefix.

    Open it with ``await RedisStore.from_url(url)``, which owns its client and closes
    it in ``aclose()``, or wrap a client you manage with ``RedisStore(client)``; that
    client is never closed by the store. The client must not decode responses
    (events are stored as protobuf bytes).
    """

    def __init__(self, client: aioredis.Redis, *, prefix: str = "helix") -> None:
        """Use ``client`` (which stays the caller's) with keys under ``prefix``.

        Raises:
            UsageError: ``prefix`` is empty or ``client`` decodes responses.
        """
        if not prefix:
            raise UsageError("RedisStore needs a non-empty key prefix")
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise UsageError("RedisStore needs a client with decode_responses=False")
        self._client = client
        self._owns_client = False
        self._closed = False
        index = RedisSessionIndex(client, prefix)
        self._index = index
        self._sessions = RedisSessions(client, prefix, index)
        self._log = RedisEventLog(client, prefix)
        self._checkpoints = RedisCheckpoints(client, prefix)
        self._leases = RedisLeases(client, prefix)
        self._interrupts = RedisInterrupts(client, prefix)
        self._inputs = RedisInputs(client, prefix)
        self._refs = RedisChildRefs(client, prefix)
        self._outbox = RedisOutbox(client, prefix)
        self._retention = RedisRetention(client, prefix, index.listed)

    @classmethod
    async def from_url(
        cls,
        url: str,
        *,
        prefix: str = "helix",
        timeout_s: float = 5.0,
        allow_volatile: bool | None = None,
    ) -> RedisStore:
        """Connect to ``url`` (``redis://``, ``rediss://``, ``unix://``) and check it answers.

        Args:
            url: the server; query options in it (``socket_timeout``...) win over ours.
            prefix: the start of every key, so stores can share one database.
            timeout_s: how long to wait to connect and for each reply.
            allow_volatile: accept a server that keeps nothing on disk (no AOF, no
                RDB snapshots); ``None``: ``HELIX_ALLOW_VOLATILE_STORE`` decides.

        Raises:
            UsageError: the URL has an option redis does not know or cannot read
                (``?prefx=``, ``?socket_timeout=abc``), or the server keeps nothing
                on disk and volatile data was not allowed.
            StoreUnavailable: the server does not answer.
            StoreError: it refused us (for example a wrong password).
        """
        where = describe_url(url)
        try:
            client = aioredis.Redis.from_url(
                url,
                decode_responses=False,
                socket_connect_timeout=timeout_s,
                socket_timeout=timeout_s,
                # No client-side resends: after a lost reply a resend could apply a write
                # twice (take an interrupt twice, report a create as lost). The error is
                # a retryable StoreUnavailable and the caller decides.
                retry=Retry(NoBackoff(), 0),
            )
        except ValueError as exc:  # redis-py's parse of a query value
            raise UsageError(f"Redis store URL {where}: {exc}") from exc
        try:
            with map_redis_errors():
                await client.ping()
                if not volatile_allowed(allow_volatile):
                    await require_persistence(client, where)
        except BaseException as exc:
            await client.aclose()
            if isinstance(exc, StoreError):
                raise type(exc)(f"cannot use the Redis store at {where}: {exc.message}") from exc
            if isinstance(exc, TypeError):
                # redis-py hands unknown query options to the connection as keywords.
                raise UsageError(
                    f"Redis store URL {where} has an option redis does not accept ({exc}); "
                    "helix reads only ?prefix="
                ) from exc
            raise
        store = cls(client, prefix=prefix)
        store._owns_client = True
        return store

    async def __aenter__(self) -> RedisStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client if the store owns it (``from_url``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            with map_redis_errors():
                await self._client.aclose()

    @contextmanager
    def _open(self) -> Iterator[None]:
        """Refuse a closed store; translate the driver's errors of what runs inside."""
        if self._closed:
            raise UsageError("RedisStore is closed")
        with map_redis_errors():
            yield

    # SessionStore, SessionIndex

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        """Create ``record`` unless its id exists (see ``Store.create_session``)."""
        with self._open():
            return await self._sessions.create_session(record, lease_ttl_s=lease_ttl_s)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when it does not exist."""
        with self._open():
            return await self._sessions.get_session(session_id)

    async def update_session(
        self,
        session_id: str,
        update: SessionUpdate,
        *,
        expected_status: SessionStatus | None = None,
    ) -> SessionRecord | None:
        """Apply ``update``, optionally only while the status matches (see ``Store``)."""
        with self._open():
            return await self._sessions.update_session(
                session_id, update, expected_status=expected_status
            )

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        """Sessions in ``status``, oldest first."""
        with self._open():
            return await self._sessions.list_sessions(status=status)

    async def query_sessions(self, query: SessionQuery, *, limit: int) -> SessionPage:
        """The sessions ``query`` matches, newest first, from the owner's set."""
        with self._open():
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
        """Append ``events`` in one script, assigning their sequences (see ``Store.append``)."""
        with self._open():
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
        with self._open():
            return await self._log.read(session_id, from_sequence=from_sequence, limit=limit)

    async def read_encoded(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[bytes]:
        """``read``'s page as the bytes stored, each with its sequence (see
        ``EncodedEventReader``)."""
        with self._open():
            return await self._log.read_encoded(
                session_id, from_sequence=from_sequence, limit=limit
            )

    async def wait_for_events(
        self, session_id: str, *, from_sequence: int, timeout_s: float
    ) -> bool:
        """Block on the session's stream (``XREAD BLOCK``) until it grows past ``from_sequence``."""
        with self._open():
            return await self._log.wait_for_events(
                session_id, from_sequence=from_sequence, timeout_s=timeout_s
            )

    # CheckpointStore

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the session's checkpoint, fenced by the log's end (see ``Store``)."""
        with self._open():
            await self._checkpoints.save_checkpoint(checkpoint)

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's latest checkpoint, or ``None``."""
        with self._open():
            return await self._checkpoints.load_checkpoint(session_id)

    # InterruptStore, InterruptLookup, InputStore

    async def set_interrupt(self, session_id: str, reason: str, *, abort: bool = False) -> None:
        """Record an interrupt request; a later one replaces an untaken one, but a plain
        interrupt never replaces an abort."""
        with self._open():
            await self._interrupts.set_interrupt(session_id, reason, abort=abort)

    async def take_interrupt(self, session_id: str) -> Interrupt | None:
        """Read and clear the session's interrupt request (one script)."""
        with self._open():
            return await self._interrupts.take_interrupt(session_id)

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` with an untaken interrupt request (one ``MGET``)."""
        with self._open():
            return await self._interrupts.pending_interrupts(session_ids)

    async def put_answer(
        self, session_id: str, request_id: str, answer_json: str
    ) -> tuple[str, bool]:
        """Record the answer unless the request has one (one script; see ``InputStore``)."""
        with self._open():
            return await self._inputs.put_answer(session_id, request_id, answer_json)

    async def list_answers(self, session_id: str) -> dict[str, str]:
        """The session's answers by request id (one ``HGETALL``)."""
        with self._open():
            return await self._inputs.list_answers(session_id)

    # ChildRefStore

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        """Insert or replace the ref keyed by (parent, child session id)."""
        with self._open():
            await self._refs.put_subsession_ref(ref)

    async def list_subsession_refs(self, parent_session_id: str) -> list[SubSessionRef]:
        """The parent's refs, in the order they were first stored."""
        with self._open():
            return await self._refs.list_subsession_refs(parent_session_id)

    async def get_subsession_ref(
        self, parent_session_id: str, child_session_id: str
    ) -> SubSessionRef | None:
        """The ref keyed by (parent, child session id), or ``None``."""
        with self._open():
            return await self._refs.get_subsession_ref(parent_session_id, child_session_id)

    # OutboxStore

    async def put_commands(self, commands: Sequence[ChildCommand]) -> None:
        """Record ``commands`` in one script (an upsert keeping the first ``created_at``;
        see ``Store``)."""
        with self._open():
            await self._outbox.put_commands(commands)

    async def list_commands(self, *, limit: int = 100) -> list[ChildCommand]:
        """Pending commands, oldest first (``created_at``, then the key), at most ``limit``."""
        with self._open():
            return await self._outbox.list_commands(limit=limit)

    async def record_attempt(self, command: ChildCommand) -> None:
        """Count a failed delivery attempt; a no-op when the command is gone."""
        with self._open():
            await self._outbox.record_attempt(command)

    async def delete_command(self, command: ChildCommand) -> None:
        """Drop a delivered command; a no-op when it is gone."""
        with self._open():
            await self._outbox.delete_command(command)

    # LeaseStore

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        """Take or renew the lease if it is free, lapsed or already ``owner``'s, by the
        Redis server's clock."""
        with self._open():
            return await self._leases.acquire_lease(session_id, owner, ttl_s=ttl_s)

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        """``acquire_lease`` for every id in one round trip: the ids ``owner`` holds now."""
        with self._open():
            return await self._leases.renew_leases(session_ids, owner, ttl_s=ttl_s)

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        with self._open():
            await self._leases.release_lease(session_id, owner)

    # RetentionStore

    async def finished_sessions(
        self, *, finished_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[SessionRecord]:
        """Finished sessions ended by ``finished_before``, oldest end first (``RetentionStore``)."""
        with self._open():
            return await self._retention.finished_sessions(
                finished_before=finished_before, after=after, limit=limit
            )

    async def expire_sessions(
        self, candidates: Sequence[Candidate], *, finished_before: float, keep_tombstone_s: float
    ) -> list[str]:
        """Remove the candidates the rule still allows, one script each."""
        with self._open():
            return await self._retention.expire_sessions(
                candidates, finished_before=finished_before, keep_tombstone_s=keep_tombstone_s
            )

    async def get_tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of an expired session, while Redis keeps it."""
        with self._open():
            return await self._retention.get_tombstone(session_id)

    async def drop_tombstones(self, *, kept_until: float, limit: int) -> int:
        """Nothing to do: tombstones are keys Redis expires itself."""
        return await self._retention.drop_tombstones(kept_until=kept_until, limit=limit)
