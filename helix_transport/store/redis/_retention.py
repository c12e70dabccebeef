"""Retention in a Redis store.

Keys, under the store's prefix:

- ``status:finished-at``: a sorted set of finished session ids scored by ``finished_at``,
  which the store's update scripts add to when a session ends (a continued session
  stays in it; the sweep drops it there while it runs, and its next end adds it back).
- ``status:finished-at:indexed``: set once sessions that ended before the index existed
  (before retention) have been added to it, by the first sweep.
- ``expired:{id}``: an expired session's tombstone, a JSON string that Redis itself
  removes when its time is up (``PX``).

A session is removed by one script (``_EXPIRE``) that re-checks the rule and unlinks
every key of it at once. Not ``EXPIRE`` on each key: keys expire one by one, so a
reader could find a record whose log is gone (and replay nothing of a finished
session), and the status set and outbox would keep members of nothing. ``UNLINK``
frees a long log's memory off Redis's main thread.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis

from helix_transport._events import SessionStatus
from helix_transport.store._records import SessionRecord
from helix_transport.store._retention import Candidate, Tombstone, finished_by
from helix_transport.store.redis._codec import decode_session

# KEYS: the session's owner set in the listing index (``_listing``), whose key
# is a digest Lua cannot make; the other keys (two sessions, the outbox, the retention
# index) are built here from the prefix (a single Redis). ARGV: prefix, session id, root id, finished_before, tombstone ms, now, then the
# outbox members the session owes its children. expirable(), in Lua: answers 1 when
# it removed the session.
_EXPIRE = """
local p, id, root, cutoff = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local index = p .. ':status:finished-at'
local function finished(key)
  local f = redis.call('HMGET', key, 'status', 'finished_at')
  if not f[1] or f[1] == 'running' or f[1] == 'suspended' or not f[2] or f[2] == '' then
    return false
  end
  return tonumber(f[2]) <= cutoff
end
local key = p .. ':session:' .. id
local own = redis.call('HMGET', key, 'status', 'principal', 'tenant')
if not own[1] then
  redis.call('ZREM', index, id)
  return 0
end
if not finished(key) then return 0 end
local root_key = p .. ':session:' .. root
if root ~= id and redis.call('EXISTS', root_key) == 1 and not finished(root_key) then
  return 0
end
redis.call('UNLINK', key, p .. ':events:' .. id, p .. ':checkpoint:' .. id,
  p .. ':interrupt:' .. id, p .. ':interrupt-abort:' .. id, p .. ':answers:' .. id,
  p .. ':refs:' .. id, p .. ':refs-order:' .. id)
redis.call('SREM', p .. ':status:' .. own[1], id)
redis.call('ZREM', index, id)
redis.call('ZREM', KEYS[1], ARGV[7])
for i = 8, #ARGV do
  redis.call('ZREM', p .. ':commands', ARGV[i])
  redis.call('UNLINK', p .. ':command:' .. ARGV[i])
end
local now = tonumber(ARGV[6])
local ms = tonumber(ARGV[5])
local tombstone = cjson.encode({expired_at = now, kept_until = now + ms / 1000,
  principal = own[2] or '', tenant = own[3] or ''})
redis.call('SET', p .. ':expired:' .. id, tombstone, 'PX', ms)
return 1
"""

# KEYS: the index, the session's hash. ARGV: the session id. Drops a member that is
# running again or gone, atomically with the check (a session that ends again in
# between is in the index for its new end, and stays).
_FORGET = """
local status = redis.call('HGET', KEYS[2], 'status')
if not status or status == 'running' or status == 'suspended' then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
"""


class RedisRetention:
    """``RetentionStore`` on ``client``, keys under ``prefix``."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        listed: Callable[[SessionRecord], tuple[str, str]],
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._listed = listed
        """A session -> its owner's set in the listing index and its member there."""
        self._index = f"{prefix}:status:finished-at"
        self._expire = client.register_script(_EXPIRE)
        self._forget = client.register_script(_FORGET)
        self._indexed = False

    async def _index_older_sessions(self) -> None:
        """Add to the index the finished sessions stored before it existed (once per
        store; replicas doing it at once add the same scores)."""
        marker = f"{self._index}:indexed"
        if self._indexed or await self._client.exists(marker):
            self._indexed = True
            return
        for status in SessionStatus:
            if not status.is_terminal:
                continue
            found = f"{self._prefix}:status:{status.value}"
            async for member in self._client.sscan_iter(found, count=500):
                session_id = bytes(member).decode()
                raw = await cast(
                    "Awaitable[bytes | None]",
                    self._client.hget(self._session(session_id), "finished_at"),
                )
                if raw:  # NX: an end indexed since is newer
                    await self._client.zadd(self._index, {session_id: float(raw)}, nx=True)
        await self._client.set(marker, "1")
        self._indexed = True

    async def finished_sessions(
        self, *, finished_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[SessionRecord]:
        """Finished sessions ended by ``finished_before``, by (finished_at, session_id)."""
        if limit < 1:
            return []
        await self._index_older_sessions()
        low: float | str = after[0] if after is not None else "-inf"
        offset = 0
        while True:
            page = await self._client.zrangebyscore(
                self._index, low, finished_before, start=offset, num=limit, withscores=True
            )
            keys = [(float(score), bytes(m).decode()) for m, score in page]
            keys = [key for key in keys if after is None or key > after]
            records = await self._records([session_id for _, session_id in keys], finished_before)
            if records or len(page) < limit:
                return records
            offset += limit  # a page of only stale members: look further

    async def _records(self, ids: list[str], finished_before: float) -> list[SessionRecord]:
        if not ids:
            return []
        async with self._client.pipeline(transaction=False) as pipe:
            for session_id in ids:
                pipe.hgetall(self._session(session_id))
            rows = await pipe.execute()
        records, stale = [], []
        for session_id, fields in zip(ids, rows, strict=True):
            record = decode_session(fields) if fields else None
            if record is not None and finished_by(record, finished_before):
                records.append(record)
            elif record is None or not record.status.is_terminal:
                stale.append(session_id)
        for session_id in stale:
            await self._forget(keys=[self._index, self._session(session_id)], args=[session_id])
        return records

    async def expire_sessions(
        self, candidates: Sequence[Candidate], *, finished_before: float, keep_tombstone_s: float
    ) -> list[str]:
        """Remove each candidate the rule allows, one atomic script each."""
        now = time.time()
        owed = await self._commands_of({c.session_id for c in candidates})
        listed = await self._listed_entries([c.session_id for c in candidates])
        ms = max(1, int(keep_tombstone_s * 1000))
        async with self._client.pipeline(transaction=False) as pipe:
            for c, (owned, member) in zip(candidates, listed, strict=True):
                args: list[str | bytes] = [self._prefix, c.session_id, c.root_session_id]
                args += [repr(finished_before), str(ms), repr(now), member]
                args += owed.get(c.session_id, [])
                await self._expire(keys=[owned], args=args, client=pipe)
            answers = await pipe.execute()
        return [c.session_id for c, done in zip(candidates, answers, strict=True) if done == 1]

    async def _listed_entries(self, ids: list[str]) -> list[tuple[str, str]]:
        """Each session's (owner set, member) in the listing index; ("", "") for one
        already gone (the script then removes nothing)."""
        async with self._client.pipeline(transaction=False) as pipe:
            for session_id in ids:
                pipe.hgetall(self._session(session_id))
            rows = await pipe.execute()
        return [self._listed(decode_session(fields)) if fields else ("", "") for fields in rows]

    async def _commands_of(self, parents: set[str]) -> dict[str, list[bytes]]:
        """The outbox members each of ``parents`` holds (the outbox is small: pending
        commands only)."""
        owed: dict[str, list[bytes]] = {}
        async for member, _ in self._client.zscan_iter(f"{self._prefix}:commands", count=500):
            parent = bytes(member).split(b"\x00", 1)[0].decode()
            if parent in parents:
                owed.setdefault(parent, []).append(bytes(member))
        return owed

    async def get_tombstone(self, session_id: str) -> Tombstone | None:
        """The session's tombstone while Redis keeps it."""
        raw = await self._client.get(f"{self._prefix}:expired:{session_id}")
        if raw is None:
            return None
        data: dict[str, Any] = json.loads(raw)
        return Tombstone(session_id=session_id, **data)

    async def drop_tombstones(self, *, kept_until: float, limit: int) -> int:
        """Nothing to do: tombstones are keys Redis expires itself."""
        return 0

    def _session(self, session_id: str) -> str:
        return f"{self._prefix}:session:{session_id}"
