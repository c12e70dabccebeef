"""Leases in a Redis store: the ``owner`` and ``lease_expires_at`` fields of the
session's hash, judged by the server's clock. The store translates the driver's errors."""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from helix_transport._exceptions import SessionNotFound

# KEYS: session hash. ARGV: owner, ttl seconds. The server's clock decides expiry, so
# replicas with skewed clocks still agree on when a lease has lapsed.
_ACQUIRE_LEASE = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expires = tonumber(redis.call('HGET', KEYS[1], 'lease_expires_at'))
if owner ~= '' and owner ~= ARGV[1] and expires > now then return 0 end
local until_ = string.format('%.17g', now + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease_expires_at', until_)
return 1
"""

# KEYS: session hash. ARGV: owner.
_RELEASE_LEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'owner', '', 'lease_expires_at', '0.0')
end
"""


class RedisLeases:
    """``LeaseStore`` on ``client``, keys under ``prefix``."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._acquire = client.register_script(_ACQUIRE_LEASE)
        self._release = client.register_script(_RELEASE_LEASE)

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        """Take or renew the lease if it is free, lapsed or already ``owner``'s.

        Expiry is judged by the Redis server's clock, not this process's.

        Raises:
            SessionNotFound: no such session.
        """
        answer = await self._acquire(keys=[self._key(session_id)], args=[owner, repr(float(ttl_s))])
        if answer == -1:
            raise SessionNotFound(session_id)
        return bool(answer == 1)

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        """``acquire_lease`` for every id, pipelined in one round trip: the ids whose
        lease ``owner`` holds now (a missing session is not held)."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        ttl = repr(float(ttl_s))
        async with self._client.pipeline(transaction=False) as pipe:
            for session_id in ids:
                await self._acquire(keys=[self._key(session_id)], args=[owner, ttl], client=pipe)
            answers = await pipe.execute()
        return {session_id for session_id, answer in zip(ids, answers, strict=True) if answer == 1}

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        await self._release(keys=[self._key(session_id)], args=[owner])

    def _key(self, session_id: str) -> str:
        return f"{self._prefix}:session:{session_id}"
