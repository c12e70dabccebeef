"""The shared store: Redis, for several replicas of a service working on one state.

Every key starts with the store's prefix (``{prefix}:...``):

- ``session:{id}``: a hash with one field per ``SessionRecord`` field.
- ``status:{status}``: a set of the session ids in that status (``list_sessions``).
- ``owned:{owner}``: each owner's sessions, newest last (``_redis_listing``).
- ``events:{id}``: the session's log, a stream whose entry ids are ``0-<sequence>``.
- ``checkpoint:{id}``: the checkpoint as a JSON string.
- ``interrupt:{id}`` / ``interrupt-abort:{id}`` / ``answers:{id}``: see ``_redis_inputs``.
- ``refs:{parent}`` / ``refs-order:{parent}``: refs by child id; child ids, first stored first.
- ``commands`` / ``command:{member}``: the outbox of child commands (see ``_redis_outbox``).
- ``status:finished-at`` / ``expired:{id}``: retention (see ``_redis_retention``).

Each write that touches more than one key, or reads before it writes, is one Lua
script, so it is atomic on the server without WATCH/MULTI round trips. Scripts touch
keys of several sessions (the status sets), so this needs a single Redis, not Redis
Cluster. Nor Sentinel: the store connects to one address and follows no failover.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from typing import cast
from urllib.parse import urlsplit, urlunsplit

from helix_transport._optional import requires

with requires("redis", "the Redis store (redis://)"):
    import redis.asyncio as aioredis
    import redis.exceptions as redis_errors
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    SequenceConflict,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store import _redis_listing as listing
from helix_transport.store._base import (
    READ_LIMIT,
    appended_count,
    check_checkpoint,
    check_lease,
    given_bytes,
)
from helix_transport.store._listing import SessionPage, SessionQuery
from helix_transport.store._records import (
    Checkpoint,
    ChildCommand,
    Interrupt,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    Usage,
    merge_commands,
)
from helix_transport.store._redis_codec import (
    _checkpoint_json,
    _decode_session,
    _field_pairs,
    _ref_from_json,
    _ref_to_json,
    _serialize_unsequenced,
)
from helix_transport.store._redis_inputs import RedisInputs
from helix_transport.store._redis_outbox import RedisOutbox
from helix_transport.store._redis_persistence import require_persistence, volatile_allowed
from helix_transport.store._redis_retention import RedisRetention
from helix_transport.store._redis_scripts import (
    _ACQUIRE_LEASE,
    _APPEND,
    _CREATE,
    _PUT_REF,
    _RELEASE_LEASE,
    _SAVE_CHECKPOINT_LUA,
    _UPDATE,
)
from helix_transport.store._retention import Candidate, Tombstone


@contextmanager
def _map_redis_errors() -> Iterator[None]:
    """Translate ``redis`` exceptions into the helix error tree."""
    try:
        yield
    except (redis_errors.AuthenticationError, redis_errors.AuthorizationError) as exc:
        # Subclasses of ConnectionError, but retrying cannot fix a wrong password.
        raise StoreError(f"redis: {exc}") from exc
    except (
        redis_errors.ConnectionError,
        redis_errors.TimeoutError,
        # A primary demoted during failover refuses writes until clients move on.
        redis_errors.ReadOnlyError,
    ) as exc:
        raise StoreUnavailable(f"redis: {exc}") from exc
    except redis_errors.RedisError as exc:
        raise StoreError(f"redis: {exc}") from exc


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
        # A blocked XREAD must return before the client's own reply timeout fires.
        socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
        self._block_cap_s = float(socket_timeout) / 2 if socket_timeout else 5.0
        self._prefix = prefix
        self._save_checkpoint = client.register_script(_SAVE_CHECKPOINT_LUA)
        self._owns_client = False
        self._closed = False
        self._create = client.register_script(_CREATE)
        self._update = client.register_script(_UPDATE)
        self._append = client.register_script(_APPEND)
        self._put_ref = client.register_script(_PUT_REF)
        self._acquire = client.register_script(_ACQUIRE_LEASE)
        self._release = client.register_script(_RELEASE_LEASE)
        self._outbox = RedisOutbox(client, prefix)
        self._inputs = RedisInputs(client, prefix)
        self._index = listing.RedisSessionIndex(client, prefix)
        self._retention = RedisRetention(client, prefix, self._index.listed)

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
        where = _describe_url(url)
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
            with _map_redis_errors():
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

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        """Create ``record`` unless its id exists (see ``Store.create_session``)."""
        self._check_open()
        check_lease(record, lease_ttl_s)
        keys = [self._key("session", record.session_id), self._key("status", record.status.value)]
        keys.append(self._index.key_of(record))
        ttl = "" if lease_ttl_s is None else repr(float(lease_ttl_s))
        args = [record.session_id, ttl, listing.member(record), *_field_pairs(record)]
        with _map_redis_errors():
            created, fields = await self._create(keys=keys, args=args)
        return _decode_session(fields), created == 1

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when it does not exist."""
        self._check_open()
        with _map_redis_errors():
            # redis-py types replies as "awaitable or not" for its sync/async clients.
            fields = await cast(
                "Awaitable[dict[bytes, bytes]]",
                self._client.hgetall(self._key("session", session_id)),
            )
        return _decode_session(fields) if fields else None

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
        self._check_open()
        expected = "" if expected_status is None else expected_status.value
        head, pairs = self._update_args(update)
        args = [expected, *head, *pairs]
        with _map_redis_errors():
            answer = await self._update(keys=[self._key("session", session_id)], args=args)
        if answer[0] == b"missing":
            raise SessionNotFound(session_id)
        return _decode_session(answer[1]) if answer[0] == b"ok" else None

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        """Sessions in ``status``, oldest first."""
        self._check_open()
        with _map_redis_errors():
            ids = await cast(
                "Awaitable[set[bytes]]", self._client.smembers(self._key("status", status.value))
            )
            async with self._client.pipeline(transaction=False) as pipe:
                for session_id in ids:
                    pipe.hgetall(self._key("session", session_id.decode()))
                rows = await pipe.execute()
        # The set and the hashes are read apart, so re-check: a session may have
        # moved to another status (or been removed) in between.
        records = [_decode_session(fields) for fields in rows if fields]
        records = [r for r in records if r.status == status]
        return sorted(records, key=lambda r: (r.created_at, r.session_id))

    async def query_sessions(self, query: SessionQuery, *, limit: int) -> SessionPage:
        """The sessions ``query`` matches, newest first, from the owner's set."""
        self._check_open()
        with _map_redis_errors():
            return await self._index.query(query, limit)

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

        When the append fails, the events keep the sequences they had before. A
        ``checkpoint`` is saved in the same atomic write.

        Raises:
            SessionNotFound: no such session.
            SequenceConflict: the log does not end at ``expected_sequence``.
        """
        self._check_open()
        # Sequences are assigned inside the script, after the events are serialized:
        # the entry id 0-<sequence> is the single source of truth, and ``read`` stamps
        # it back onto each event. So events are stored without one, or with the one
        # the writer's fence implies (``encoded``; a conflict stores nothing).
        given = given_bytes(events, encoded)
        check_checkpoint(session_id, checkpoint, expected_sequence, appended_count(events, given))
        # Before anything is written: a checkpoint that is not JSON stores nothing.
        saved = None if checkpoint is None else _checkpoint_json(checkpoint)
        payloads = (
            list(given)
            if given is not None
            else [_serialize_unsequenced(event) for event in events]
        )
        head, pairs = self._update_args(update or SessionUpdate())
        args: list[str | bytes] = [
            str(expected_sequence),
            uuid.uuid4().hex,
            str(len(payloads)),
            "0" if update is None else "1",
            *head,
            *payloads,
            *pairs,  # the script finds them after the payloads
        ]
        keys = [self._key("session", session_id), self._key("events", session_id)]
        if saved is not None:
            args.append(saved)
            keys.append(self._key("checkpoint", session_id))
        with _map_redis_errors():
            answer = await self._append(keys=keys, args=args)
        if answer[0] == b"missing":
            raise SessionNotFound(session_id)
        last: int = answer[1]
        if answer[0] == b"conflict":
            raise SequenceConflict(session_id, expected_sequence, last)
        for offset, event in enumerate(events, start=last - len(events) + 1):
            event.sequence = offset
        return last

    async def read(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[StreamEvent]:
        """Up to ``limit`` (at most ``READ_LIMIT``) events after ``from_sequence``.

        An unknown session reads as an empty log.
        """
        self._check_open()
        count = min(limit, READ_LIMIT)
        if count < 1:
            return []
        # "(" makes the start exclusive: entries strictly after 0-<from_sequence>.
        start = f"(0-{max(from_sequence, 0)}"
        with _map_redis_errors():
            entries = await self._client.xrange(
                self._key("events", session_id), min=start, max="+", count=count
            )
        events = []
        for entry_id, fields in entries:
            event = StreamEvent.FromString(fields[b"event"])
            event.sequence = int(entry_id.split(b"-")[1])
            events.append(event)
        return events

    async def wait_for_events(
        self, session_id: str, *, from_sequence: int, timeout_s: float
    ) -> bool:
        """Block on the session's stream (``XREAD BLOCK``) until it grows past ``from_sequence``."""
        self._check_open()
        # Stay under the client's reply timeout, or the blocked read itself times out.
        block_ms = max(1, int(min(timeout_s, self._block_cap_s) * 1000))
        with _map_redis_errors():
            found = await self._client.xread(
                {self._key("events", session_id): f"0-{max(from_sequence, 0)}"},
                count=1,
                block=block_ms,
            )
        return bool(found)

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the session's checkpoint, fenced by the log's end (see ``Store``)."""
        self._check_open()
        saved = _checkpoint_json(checkpoint)
        keys = [
            self._key("session", checkpoint.session_id),
            self._key("checkpoint", checkpoint.session_id),
        ]
        with _map_redis_errors():
            actual = await self._save_checkpoint(keys=keys, args=[checkpoint.last_sequence, saved])
        if int(actual) != checkpoint.last_sequence:
            raise SequenceConflict(checkpoint.session_id, checkpoint.last_sequence, int(actual))

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's latest checkpoint, or ``None``."""
        self._check_open()
        with _map_redis_errors():
            raw = await self._client.get(self._key("checkpoint", session_id))
        if raw is None:
            return None
        data = json.loads(raw)
        data["usage"] = Usage(**data["usage"])
        return Checkpoint(**data)

    async def set_interrupt(self, session_id: str, reason: str, *, abort: bool = False) -> None:
        """Record an interrupt request; a later one replaces an untaken one, but a plain
        interrupt never replaces an abort."""
        self._check_open()
        with _map_redis_errors():
            await self._inputs.set_interrupt(session_id, reason, abort)

    async def take_interrupt(self, session_id: str) -> Interrupt | None:
        """Read and clear the session's interrupt request (one script)."""
        self._check_open()
        with _map_redis_errors():
            return await self._inputs.take_interrupt(session_id)

    async def put_answer(
        self, session_id: str, request_id: str, answer_json: str
    ) -> tuple[str, bool]:
        """Record the answer unless the request has one (one script; see ``InputStore``)."""
        self._check_open()
        with _map_redis_errors():
            return await self._inputs.put_answer(session_id, request_id, answer_json)

    async def list_answers(self, session_id: str) -> dict[str, str]:
        """The session's answers by request id (one ``HGETALL``)."""
        self._check_open()
        with _map_redis_errors():
            return await self._inputs.list_answers(session_id)

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` with an untaken interrupt request (one ``MGET``)."""
        self._check_open()
        with _map_redis_errors():
            return await self._inputs.pending_interrupts(session_ids)

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        """Insert or replace the ref keyed by (parent, child session id)."""
        self._check_open()
        parent = ref.parent_session_id
        keys = [self._key("refs", parent), self._key("refs-order", parent)]
        with _map_redis_errors():
            await self._put_ref(keys=keys, args=[ref.child_session_id, _ref_to_json(ref)])

    async def list_subsession_refs(self, parent_session_id: str) -> list[SubSessionRef]:
        """The parent's refs, in the order they were first stored."""
        self._check_open()
        with _map_redis_errors():
            # MULTI/EXEC so the order and the refs are one snapshot.
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.lrange(self._key("refs-order", parent_session_id), 0, -1)
                pipe.hgetall(self._key("refs", parent_session_id))
                order, refs = await pipe.execute()
        return [_ref_from_json(refs[child]) for child in order]

    async def get_subsession_ref(
        self, parent_session_id: str, child_session_id: str
    ) -> SubSessionRef | None:
        """The ref keyed by (parent, child session id), or ``None``."""
        self._check_open()
        with _map_redis_errors():
            raw = await cast(
                "Awaitable[bytes | None]",
                self._client.hget(self._key("refs", parent_session_id), child_session_id),
            )
        return None if raw is None else _ref_from_json(raw)

    async def put_commands(self, commands: Sequence[ChildCommand]) -> None:
        """Record ``commands`` in one script (an upsert keeping the first ``created_at``;
        see ``Store``)."""
        self._check_open()
        merged = merge_commands(commands)
        if merged:
            with _map_redis_errors():
                await self._outbox.put(merged)

    async def list_commands(self, *, limit: int = 100) -> list[ChildCommand]:
        """Pending commands, oldest first (``created_at``, then the key), at most ``limit``."""
        self._check_open()
        if limit < 1:
            return []
        with _map_redis_errors():
            return await self._outbox.list_commands(limit)

    async def record_attempt(self, command: ChildCommand) -> None:
        """Count a failed delivery attempt; a no-op when the command is gone."""
        self._check_open()
        with _map_redis_errors():
            await self._outbox.record_attempt(command)

    async def delete_command(self, command: ChildCommand) -> None:
        """Drop a delivered command; a no-op when it is gone."""
        self._check_open()
        with _map_redis_errors():
            await self._outbox.delete(command)

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        """Take or renew the lease if it is free, lapsed or already ``owner``'s.

        Expiry is judged by the Redis server's clock, not this process's.

        Raises:
            SessionNotFound: no such session.
        """
        self._check_open()
        keys = [self._key("session", session_id)]
        with _map_redis_errors():
            answer = await self._acquire(keys=keys, args=[owner, repr(float(ttl_s))])
        if answer == -1:
            raise SessionNotFound(session_id)
        return bool(answer == 1)

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        """``acquire_lease`` for every id, pipelined in one round trip: the ids whose
        lease ``owner`` holds now (a missing session is not held)."""
        self._check_open()
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        ttl = repr(float(ttl_s))
        with _map_redis_errors():
            async with self._client.pipeline(transaction=False) as pipe:
                for session_id in ids:
                    await self._acquire(
                        keys=[self._key("session", session_id)], args=[owner, ttl], client=pipe
                    )
                answers = await pipe.execute()
        return {session_id for session_id, answer in zip(ids, answers, strict=True) if answer == 1}

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        self._check_open()
        with _map_redis_errors():
            await self._release(keys=[self._key("session", session_id)], args=[owner])

    async def finished_sessions(
        self, *, finished_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[SessionRecord]:
        """Finished sessions ended by ``finished_before``, oldest end first (``RetentionStore``)."""
        self._check_open()
        with _map_redis_errors():
            return await self._retention.finished_sessions(finished_before, after, limit)

    async def expire_sessions(
        self, candidates: Sequence[Candidate], *, finished_before: float, keep_tombstone_s: float
    ) -> list[str]:
        """Remove the candidates the rule still allows, one script each."""
        self._check_open()
        with _map_redis_errors():
            return await self._retention.expire(
                candidates, finished_before, keep_tombstone_s, time.time()
            )

    async def get_tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of an expired session, while Redis keeps it."""
        self._check_open()
        with _map_redis_errors():
            return await self._retention.get_tombstone(session_id)

    async def drop_tombstones(self, *, kept_until: float, limit: int) -> int:
        """Nothing to do: tombstones are keys Redis expires itself."""
        return 0

    async def aclose(self) -> None:
        """Close the client if the store owns it (``from_url``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            with _map_redis_errors():
                await self._client.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("RedisStore is closed")

    def _key(self, kind: str, name: str) -> str:
        return f"{self._prefix}:{kind}:{name}"

    def _update_args(self, update: SessionUpdate) -> tuple[list[str], list[str]]:
        """The scripts' update arguments: (status set prefix, now, terminal flag), pairs."""
        terminal = update.status is not None and update.status.is_terminal
        # Timestamps of records come from the client, as in every backend; only
        # lease expiry (compared across replicas) uses the server's clock.
        head = [self._key("status", ""), repr(time.time()), "1" if terminal else "0"]
        return head, _field_pairs(update)


def _describe_url(url: str) -> str:
    """``url`` for error messages, its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.partition(':')[0]}:***@{host}"))
