"""Session records in a Redis store.

Keys, under the store's prefix: ``session:{id}``, a hash with one field per
``SessionRecord`` field (``_codec``), and ``status:{status}``, a set of the session
ids in that status. A write that reads first is one script; ``APPLY_UPDATE`` is shared
with the event log, whose append may carry an update. The store translates the
driver's errors.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import cast

import redis.asyncio as aioredis

from helix_transport._events import SessionStatus
from helix_transport._exceptions import SessionNotFound
from helix_transport.store._base import check_lease
from helix_transport.store._records import SessionRecord, SessionUpdate
from helix_transport.store.redis._codec import decode_session, field_pairs
from helix_transport.store.redis._listing import RedisSessionIndex, member

# Applies a SessionUpdate's encoded field/value pairs (ARGV[first..last]) to the session
# hash, moving the id between status sets, exactly as ``SessionUpdate.apply`` does.
APPLY_UPDATE = """
local function apply_update(key, index_prefix, now, terminal, first, last)
  local status = redis.call('HGET', key, 'status')
  for i = first, last, 2 do
    if ARGV[i] == 'status' and ARGV[i + 1] ~= status then
      local id = redis.call('HGET', key, 'session_id')
      redis.call('SREM', index_prefix .. status, id)
      redis.call('SADD', index_prefix .. ARGV[i + 1], id)
    end
    redis.call('HSET', key, ARGV[i], ARGV[i + 1])
  end
  redis.call('HSET', key, 'updated_at', now)
  if terminal == '1' then
    redis.call('HSET', key, 'finished_at', now)
    -- Retention's index of finished sessions by their end (_retention).
    redis.call('ZADD', index_prefix .. 'finished-at', now, redis.call('HGET', key, 'session_id'))
  end
end
"""

# KEYS: session hash, its status set, its owner's set (_listing). ARGV: session
# id, lease ttl seconds or '', its member in the owner's set, field/value pairs. A
# lease's expiry is set by the server's clock, as in _ACQUIRE_LEASE.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 4))
  if ARGV[2] ~= '' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
    redis.call('HSET', KEYS[1], 'lease_expires_at', string.format('%.17g', now + tonumber(ARGV[2])))
  end
  redis.call('SADD', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], 0, ARGV[3])
  return {1, redis.call('HGETALL', KEYS[1])}
end
return {0, redis.call('HGETALL', KEYS[1])}
"""

# KEYS: session hash. ARGV: expected status or '', status set prefix, now, terminal
# flag, field/value pairs.
_UPDATE = (
    APPLY_UPDATE
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing'} end
if ARGV[1] ~= '' and ARGV[1] ~= status then return {'mismatch'} end
apply_update(KEYS[1], ARGV[2], ARGV[3], ARGV[4], 5, #ARGV)
return {'ok', redis.call('HGETALL', KEYS[1])}
"""
)


class RedisSessions:
    """``SessionStore`` on ``client``, keys under ``prefix``; a create also lists the
    session in ``index``."""

    def __init__(self, client: aioredis.Redis, prefix: str, index: RedisSessionIndex) -> None:
        self._client = client
        self._prefix = prefix
        self._index = index
        self._create = client.register_script(_CREATE)
        self._update = client.register_script(_UPDATE)

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        """Create ``record`` unless its id exists (see ``Store.create_session``)."""
        check_lease(record, lease_ttl_s)
        keys = [self._key("session", record.session_id), self._key("status", record.status.value)]
        keys.append(self._index.key_of(record))
        ttl = "" if lease_ttl_s is None else repr(float(lease_ttl_s))
        args = [record.session_id, ttl, member(record), *field_pairs(record)]
        created, fields = await self._create(keys=keys, args=args)
        return decode_session(fields), created == 1

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when it does not exist."""
        # redis-py types replies as "awaitable or not" for its sync/async clients.
        fields = await cast(
            "Awaitable[dict[bytes, bytes]]",
            self._client.hgetall(self._key("session", session_id)),
        )
        return decode_session(fields) if fields else None

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
        expected = "" if expected_status is None else expected_status.value
        head, pairs = update_args(self._prefix, update)
        args = [expected, *head, *pairs]
        answer = await self._update(keys=[self._key("session", session_id)], args=args)
        if answer[0] == b"missing":
            raise SessionNotFound(session_id)
        return decode_session(answer[1]) if answer[0] == b"ok" else None

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        """Sessions in ``status``, oldest first."""
        ids = await cast(
            "Awaitable[set[bytes]]", self._client.smembers(self._key("status", status.value))
        )
        async with self._client.pipeline(transaction=False) as pipe:
            for session_id in ids:
                pipe.hgetall(self._key("session", session_id.decode()))
            rows = await pipe.execute()
        # The set and the hashes are read apart, so re-check: a session may have
        # moved to another status (or been removed) in between.
        records = [decode_session(fields) for fields in rows if fields]
        records = [r for r in records if r.status == status]
        return sorted(records, key=lambda r: (r.created_at, r.session_id))

    def _key(self, kind: str, name: str) -> str:
        return f"{self._prefix}:{kind}:{name}"


def update_args(prefix: str, update: SessionUpdate) -> tuple[list[str], list[str]]:
    """``APPLY_UPDATE``'s arguments: (status set prefix, now, terminal flag), pairs."""
    terminal = update.status is not None and update.status.is_terminal
    # Timestamps of records come from the client, as in every backend; only
    # lease expiry (compared across replicas) uses the server's clock.
    head = [f"{prefix}:status:", repr(time.time()), "1" if terminal else "0"]
    return head, field_pairs(update)
